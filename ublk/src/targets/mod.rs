//! What a device serves: `raw`, a backing file 1:1, and `cas`, an image of
//! a content-addressed store served by the store's daemon. Each provides
//! its device's setup and queue threads to the device layer (`device`).

pub mod cas;
pub mod raw;
