//! The storage engine the benchmark drives, behind a small trait so that
//! the cas engine can replace [`FakeEngine`]; and the adapter that gives
//! the scheduler its [`Capacity`].
//!
//! [`FakeEngine`] keeps each image in memory and models only what the
//! scheduler sees of a log: a per-image quota that writes reserve, and a
//! "compactor" thread that reclaims written log at a fixed rate and sends a
//! `capacity_released` wake for each image it reclaimed from.
//!
//! ```text
//!   log quota  [ reserved (write admitted) | written (awaiting drain) | free ]
//!   try_reserve: free -> reserved        write_reserved: reserved -> written
//!   drainer (every 1 ms): written -> free at drain_bytes_per_s, then wake
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use sched::{Capacity, ImageId, Op};

/// Called with an image whose log space was reclaimed.
pub type CapacityListener = Arc<dyn Fn(ImageId) + Send + Sync>;

/// What the benchmark needs of an engine. Every call but `try_reserve` may
/// block; `try_reserve` never does.
pub trait Engine: Send + Sync + 'static {
    type Reservation: Send + 'static;
    fn add_image(&self, image: ImageId, size_bytes: u64);
    fn try_reserve(&self, image: ImageId, op: Op, len_bytes: u64) -> Option<Self::Reservation>;
    fn read(&self, image: ImageId, offset_bytes: u64, buf: &mut [u8]) -> Result<(), String>;
    fn write_reserved(
        &self,
        image: ImageId,
        offset_bytes: u64,
        data: &[u8],
        reservation: Self::Reservation,
    ) -> Result<(), String>;
    fn flush(&self, image: ImageId) -> Result<(), String>;
    /// The reclamation listener. The engine calls it holding no lock that
    /// `try_reserve` takes (the scheduler calls `try_reserve` under its lock).
    fn set_capacity_listener(&self, listener: CapacityListener);
}

/// The scheduler's view of an engine.
pub struct EngineCapacity<E>(pub Arc<E>);

impl<E: Engine> Capacity for EngineCapacity<E> {
    type Reservation = E::Reservation;

    fn try_reserve(&mut self, image: ImageId, op: Op, len_bytes: u64) -> Option<E::Reservation> {
        self.0.try_reserve(image, op, len_bytes)
    }
}

#[derive(Debug, Default)]
struct LogSpace {
    reserved_bytes: u64,
    written_bytes: u64,
}

struct FakeImage {
    data: RwLock<Vec<u8>>,
    log: Mutex<LogSpace>,
}

/// See the module documentation.
pub struct FakeEngine {
    log_quota_bytes: u64,
    drain_bytes_per_s: u64,
    images: RwLock<HashMap<ImageId, Arc<FakeImage>>>,
    listener: Mutex<Option<CapacityListener>>,
    stop: AtomicBool,
    drainer: Mutex<Option<JoinHandle<()>>>,
}

/// Log bytes reserved for one request.
#[derive(Debug)]
pub struct FakeReservation {
    log_bytes: u64,
}

/// Bytes a log record of `op` takes: the payload for WRITE, one 512-byte
/// record otherwise.
fn log_bytes_needed(op: Op, len_bytes: u64) -> u64 {
    if op == Op::Write {
        len_bytes
    } else {
        512
    }
}

impl FakeEngine {
    pub fn start(log_quota_bytes: u64, drain_bytes_per_s: u64) -> Arc<Self> {
        let engine = Arc::new(FakeEngine {
            log_quota_bytes,
            drain_bytes_per_s,
            images: RwLock::new(HashMap::new()),
            listener: Mutex::new(None),
            stop: AtomicBool::new(false),
            drainer: Mutex::new(None),
        });
        let weak = Arc::downgrade(&engine);
        let handle = thread::Builder::new()
            .name("fake-drainer".into())
            .spawn(move || drain_loop(weak))
            .expect("spawn the drainer");
        *engine.drainer.lock().expect("drainer lock") = Some(handle);
        engine
    }

    /// Stops and joins the drainer thread.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(h) = self.drainer.lock().expect("drainer lock").take() {
            h.join().expect("the drainer panicked");
        }
    }

    fn image(&self, image: ImageId) -> Result<Arc<FakeImage>, String> {
        self.images.read().expect("images lock").get(&image).cloned().ok_or(format!("no image {image}"))
    }

    /// One drain tick: reclaims up to `budget` written bytes per image.
    fn drain(&self, budget_bytes: u64) {
        let images: Vec<(ImageId, Arc<FakeImage>)> =
            self.images.read().expect("images lock").iter().map(|(&i, m)| (i, m.clone())).collect();
        for (id, image) in images {
            let reclaimed = {
                let mut log = image.log.lock().expect("log lock");
                let n = log.written_bytes.min(budget_bytes);
                log.written_bytes -= n;
                n
            };
            // The wake goes out with no engine lock held.
            if reclaimed > 0 {
                let listener = self.listener.lock().expect("listener lock").clone();
                if let Some(l) = listener {
                    l(id);
                }
            }
        }
    }
}

fn drain_loop(engine: Weak<FakeEngine>) {
    const TICK: Duration = Duration::from_millis(1);
    let mut last = Instant::now();
    loop {
        thread::sleep(TICK);
        let Some(engine) = engine.upgrade() else { return };
        if engine.stop.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let elapsed = now.duration_since(last).min(TICK * 10);
        last = now;
        engine.drain((engine.drain_bytes_per_s as f64 * elapsed.as_secs_f64()) as u64);
    }
}

impl Engine for FakeEngine {
    type Reservation = FakeReservation;

    fn add_image(&self, image: ImageId, size_bytes: u64) {
        let size = usize::try_from(size_bytes).expect("image fits in memory");
        let img = FakeImage { data: RwLock::new(vec![0; size]), log: Mutex::new(LogSpace::default()) };
        self.images.write().expect("images lock").insert(image, Arc::new(img));
    }

    fn try_reserve(&self, image: ImageId, op: Op, len_bytes: u64) -> Option<FakeReservation> {
        let img = self.image(image).ok()?;
        let need = log_bytes_needed(op, len_bytes);
        let mut log = img.log.lock().expect("log lock");
        let used = log.reserved_bytes + log.written_bytes;
        if used + need > self.log_quota_bytes {
            return None;
        }
        log.reserved_bytes += need;
        Some(FakeReservation { log_bytes: need })
    }

    fn read(&self, image: ImageId, offset_bytes: u64, buf: &mut [u8]) -> Result<(), String> {
        let img = self.image(image)?;
        let data = img.data.read().expect("data lock");
        let start = usize::try_from(offset_bytes).map_err(|_| "offset out of range")?;
        let src = data.get(start..start + buf.len()).ok_or("read past the end of the image")?;
        buf.copy_from_slice(src);
        Ok(())
    }

    fn write_reserved(
        &self,
        image: ImageId,
        offset_bytes: u64,
        data: &[u8],
        r: FakeReservation,
    ) -> Result<(), String> {
        let img = self.image(image)?;
        {
            let mut dst = img.data.write().expect("data lock");
            let start = usize::try_from(offset_bytes).map_err(|_| "offset out of range")?;
            dst.get_mut(start..start + data.len())
                .ok_or("write past the end of the image")?
                .copy_from_slice(data);
        }
        let mut log = img.log.lock().expect("log lock");
        log.reserved_bytes -= r.log_bytes;
        log.written_bytes += r.log_bytes;
        Ok(())
    }

    fn flush(&self, image: ImageId) -> Result<(), String> {
        self.image(image).map(|_| ())
    }

    fn set_capacity_listener(&self, listener: CapacityListener) {
        *self.listener.lock().expect("listener lock") = Some(listener);
    }
}
