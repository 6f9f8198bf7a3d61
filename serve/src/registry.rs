//! The attached images by scheduler id: how a worker that is dispatched a
//! request finds the device it belongs to.

use crate::{DeviceCore, TagBuffers};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// Attached devices by scheduler id, for the workers.
pub struct Registry<B> {
    devices: RwLock<HashMap<sched::ImageId, Arc<DeviceCore<B>>>>,
}

impl<B> Default for Registry<B> {
    fn default() -> Self {
        Registry { devices: RwLock::new(HashMap::new()) }
    }
}

impl<B: TagBuffers> Registry<B> {
    pub fn get(&self, id: sched::ImageId) -> Option<Arc<DeviceCore<B>>> {
        self.devices.read().unwrap_or_else(|p| p.into_inner()).get(&id).cloned()
    }

    pub fn insert(&self, core: Arc<DeviceCore<B>>) {
        self.devices.write().unwrap_or_else(|p| p.into_inner()).insert(core.sched_id, core);
    }

    pub fn remove(&self, id: sched::ImageId) {
        self.devices.write().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    pub fn all(&self) -> Vec<Arc<DeviceCore<B>>> {
        self.devices.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }
}
