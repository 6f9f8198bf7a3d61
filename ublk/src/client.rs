//! The command-line side of the store daemon: `add --image`, `image ...`
//! and `stats`. With a daemon running for the store, commands go over its
//! control socket (the daemon holds the store's lock); without one, image
//! management opens the store directly and `add` starts the daemon.

use crate::cli::{AddArgs, ImageCommand, StatsArgs};
use crate::device::launch::{self, DAEMON_LOG};
use crate::protocol::Command;
use crate::targets::cas::{self as daemon, AddImageArgs};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bound on a control or stats round trip.
pub(crate) const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on attaching a device through a running daemon.
const ADD_TIMEOUT: Duration = Duration::from_secs(150);

/// The store directory, canonical (so every client names the same socket).
pub(crate) fn store_dir(store: &Path, create: bool) -> Result<PathBuf> {
    if create {
        std::fs::create_dir_all(store)
            .with_context(|| format!("creating store directory {}", store.display()))?;
    }
    store.canonicalize().map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            anyhow!(
                "no store at {} (create an image first: casblk image create NAME --size SIZE)",
                store.display()
            )
        } else {
            anyhow!("store {}: {e}", store.display())
        }
    })
}

fn query(socket: &Path, request: &trace::stats::Request, timeout: Duration) -> Result<Value> {
    crate::control_socket::query(socket, request, timeout).map_err(|e| match e {
        trace::Error::Remote(msg) => anyhow!(msg),
        other => anyhow!("store daemon at {}: {other}", socket.display()),
    })
}

/// The socket of the daemon serving `dir`, if one answers.
pub(crate) fn running_daemon(dir: &Path) -> Option<PathBuf> {
    let socket = daemon::socket_path(dir);
    if !socket.exists() {
        return None;
    }
    query(&socket, &Command::Ping {}.request(), QUERY_TIMEOUT).ok().map(|_| socket)
}

pub(crate) fn control(socket: &Path, cmd: Command, timeout: Duration) -> Result<Value> {
    query(socket, &cmd.request(), timeout)
}

/// Opens store `dir` for a one-shot command. A daemon exiting after its
/// last device went (`del`, then an image command at once) still holds
/// the store's lock for a moment: this waits for it, up to
/// [`LOCKED_STORE_WAIT`], as `add` does.
pub(crate) fn open_store(dir: &Path, create: bool) -> Result<Arc<cas::Store>> {
    let deadline = Instant::now() + LOCKED_STORE_WAIT;
    loop {
        let storage: Arc<dyn cas::storage::Storage> = Arc::new(cas::storage::FsStorage::new());
        // A one-shot command: GC runs when asked (`casblk gc`), not by itself.
        let opts = cas::StoreOptions {
            remote: crate::remote::store_remote(dir)?,
            gc_auto: cas::gc::AutoGcOptions::off(),
            ..cas::StoreOptions::default()
        };
        let store = if create {
            cas::Store::open_or_create(storage, dir, opts)
        } else {
            cas::Store::open(storage, dir, opts)
        };
        match store {
            Err(e) if held_by_another(&e.to_string()) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            r => return r.with_context(|| format!("store {}", dir.display())),
        }
    }
}

pub fn add_image(store: &Path, args: AddArgs) -> Result<()> {
    let image = args.image.clone().expect("clap requires --image or --backing");
    let dir = store_dir(store, false)?;
    // Bad values fail here, before a daemon is reached or started.
    let limits = args.limits.change(false)?.apply(sched::Limits::default());
    let req = AddImageArgs {
        image,
        id: args.id,
        shape: args.shape(),
        settings: args.store_settings.clone(),
        recover: false,
        limits,
        policy: args.policy(),
    };
    req.settings.options()?;
    req.settings.metrics_address()?;
    // A driver that cannot honour the device options refuses here, before
    // a daemon is reached or started.
    crate::device::driver::require_driver()?;
    req.policy.add_flags(crate::device::driver::driver_features().ok(), true)?;
    serve_via_daemon(&dir, &req, args.foreground)
}

/// Serves CAS device `state.id` again after its daemon died: through the
/// store's running daemon, or a new one (which opens the store, replaying
/// every image's log, before it takes the device over).
pub fn recover_image(state: &crate::device::state::DeviceState, foreground: bool) -> Result<()> {
    let crate::device::state::Target::Cas { store, image, settings, limits } = &state.target else {
        bail!("ublk device {} is not a store device", state.id);
    };
    let dir = store_dir(store, false)?;
    let req = AddImageArgs {
        image: image.clone(),
        id: state.id as i32,
        shape: state.shape,
        settings: (**settings).clone(),
        recover: true,
        limits: *limits,
        policy: Default::default(),
    };
    serve_via_daemon(&dir, &req, foreground)
}

/// Has the daemon of store `dir` serve `req`: the running one, or one
/// started now. Prints the device once it is usable.
///
/// The store's lock can be held by a daemon that no longer answers: one
/// still starting (another `add` came first: its socket appears soon) or
/// one exiting after its last device went (`del`, then `add` at once: its
/// lock goes soon). Either way this waits, up to [`LOCKED_STORE_WAIT`], for
/// a daemon to use or for the lock to come free.
fn serve_via_daemon(dir: &Path, req: &AddImageArgs, foreground: bool) -> Result<()> {
    let deadline = Instant::now() + LOCKED_STORE_WAIT;
    loop {
        if let Some(socket) = running_daemon(dir) {
            return attach_via(&socket, req);
        }
        crate::device::driver::require_driver()?;
        if !req.recover {
            crate::device::driver::require_free_id(req.id)?;
        }
        let (d, r) = (dir.to_path_buf(), req.clone());
        match launch::launch(foreground, Path::new(DAEMON_LOG), move |ready| {
            daemon::serve_store(d, daemon::Serve::First(r), ready)
        }) {
            Err(e) if held_by_another(&format!("{e:#}")) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(100));
            }
            other => return other,
        }
    }
}

/// How long `add` waits for a store locked by a daemon that does not
/// answer (starting, or exiting) before it reports the lock.
const LOCKED_STORE_WAIT: Duration = Duration::from_secs(10);

/// Whether an error (its text) says another process holds the store's lock.
fn held_by_another(error: &str) -> bool {
    error.contains("locked by another")
}

/// `casblk daemon`: the store daemon in the foreground, for a service
/// manager (see `daemon::Serve::Service`).
pub fn service(store: &Path, settings: crate::targets::cas::StoreSettings) -> Result<()> {
    settings.options()?;
    settings.metrics_address()?;
    let dir = store_dir(store, false)?;
    if running_daemon(&dir).is_some() {
        bail!("a casblk daemon already serves store {}", dir.display());
    }
    crate::device::driver::require_driver()?;
    launch::launch(true, Path::new(DAEMON_LOG), move |ready| {
        daemon::serve_store(dir, daemon::Serve::Service(settings), ready)
    })
}

/// Asks the daemon of store `store` to hand its devices over and exit
/// (`casblk upgrade`); returns whether it runs under a service manager,
/// which then restarts it.
pub fn handoff(store: &Path) -> Result<bool> {
    let dir = store_dir(store, false)?;
    let socket =
        running_daemon(&dir).ok_or_else(|| anyhow!("no casblk daemon is serving store {}", dir.display()))?;
    let reply = control(&socket, Command::Handoff {}, QUERY_TIMEOUT)?;
    Ok(reply.get("service").and_then(Value::as_bool).unwrap_or(false))
}

fn attach_via(socket: &Path, req: &AddImageArgs) -> Result<()> {
    let reply = control(socket, Command::Add(Box::new(req.clone())), ADD_TIMEOUT)?;
    let device =
        reply.get("device").and_then(Value::as_str).ok_or_else(|| anyhow!("malformed reply: {reply}"))?;
    println!("{device}");
    let id = device.strip_prefix("/dev/ublkb").and_then(|n| n.parse::<u32>().ok());
    if let (Some(id), false, false) = (id, req.recover, req.policy.is_default()) {
        let flags = crate::device::driver::open_device(id)?.dev_info().flags;
        if !req.policy.applied(crate::device::driver::driver_features().ok(), flags) {
            bail!(
                "{device} was added, but the store daemon is an older casblk that ignored --on-daemon-loss and \
                 --partitions: casblk upgrade it, then del and add the device again"
            );
        }
    }
    if !req.limits.is_unlimited() && reply.get("limits").is_none() {
        bail!(
            "{device} was added, but the store daemon is an older casblk that ignored its IO limits: \
             casblk upgrade it, then set them with casblk image limits {}",
            req.image
        );
    }
    Ok(())
}

pub fn image(store: &Path, cmd: ImageCommand) -> Result<()> {
    let create = matches!(cmd, ImageCommand::Create { .. } | ImageCommand::Import { .. });
    let dir = store_dir(store, create)?;
    let daemon = running_daemon(&dir);
    match cmd {
        ImageCommand::Create { name, size } => {
            match &daemon {
                Some(s) => {
                    control(s, Command::ImageCreate { name: name.clone(), size_bytes: size }, QUERY_TIMEOUT)?;
                }
                None => open_store(&dir, true)?.create_image(&name, size)?,
            }
            println!("{name}");
        }
        ImageCommand::Fetch { name, read_only } => {
            if daemon.is_some() {
                return Err(anyhow!(
                    "store {} is served by a running casblk daemon; image fetch works on a store nothing serves (stop its devices first)",
                    dir.display()
                ));
            }
            let how = if read_only { cas::store::FetchAs::Replica } else { cas::store::FetchAs::Owner };
            let r = open_store(&dir, false)?.fetch_image(&name, how)?;
            println!(
                "{name}: generation {} from {}, {} blocks mapped, {} packs of other stores",
                r.generation, r.root_key, r.mapped_blocks, r.foreign_packs
            );
        }
        ImageCommand::Rm { name, bucket: true } => {
            if daemon.is_some() {
                return Err(anyhow!(
                    "store {} is served by a running casblk daemon; image rm --bucket works on a store nothing serves (stop its devices first)",
                    dir.display()
                ));
            }
            let store = open_store(&dir, false)?;
            let local = store.list_images()?.iter().any(|i| i.name == name);
            let r = store.unpublish_image(&name)?;
            if local {
                store.remove_image(&name)?;
            }
            println!(
                "{name}: removed from the bucket ({} roots, {} page ranges){}",
                r.roots,
                r.page_ranges,
                if local { " and from this store" } else { "" }
            );
        }
        ImageCommand::Rm { name, bucket: false } => match &daemon {
            Some(s) => {
                control(s, Command::ImageRemove { name: name.clone() }, QUERY_TIMEOUT)?;
            }
            None => open_store(&dir, false)?.remove_image(&name)?,
        },
        ImageCommand::List { json } => {
            let rows = match &daemon {
                Some(s) => control(s, Command::ImageList {}, QUERY_TIMEOUT)?,
                None => Value::Array(
                    open_store(&dir, false)?
                        .list_images()?
                        .into_iter()
                        .map(|i| {
                            json!({
                                "name": i.name,
                                "size_bytes": i.size_bytes,
                                "device": null,
                                "kind": i.kind,
                                "origin": i.origin,
                            })
                        })
                        .collect(),
                ),
            };
            print_images(&rows, json, &dir)?;
        }
        ImageCommand::Snapshot { image, snap } => {
            let name = match &daemon {
                Some(s) => {
                    let reply = control(s, Command::ImageSnapshot { image, snap }, SNAPSHOT_TIMEOUT)?;
                    reply["snapshot"].as_str().unwrap_or_default().to_string()
                }
                None => open_store(&dir, false)?.snapshot_image(&image, &snap)?,
            };
            println!("{name}");
        }
        ImageCommand::Limits { name, clear, json, limits } => {
            let change = limits.change(clear)?;
            let reply = match &daemon {
                Some(s) => control(s, Command::ImageLimits { name: name.clone(), change }, QUERY_TIMEOUT)?,
                None => {
                    open_store(&dir, false)?.image_info(&name)?;
                    bail!(
                        "image {name} is not attached (no daemon serves store {}): IO limits belong to its \
                         device; give them to casblk add --image {name} (e.g. --read-iops 500)",
                        dir.display()
                    );
                }
            };
            crate::limits::print(&reply, json)?;
        }
        ImageCommand::Resize { name, size, shrink } => {
            let (old, new, device) = match &daemon {
                Some(s) => {
                    let r = control(
                        s,
                        Command::ImageResize { name: name.clone(), size_bytes: size, shrink },
                        // A shrink compacts the discard of the bytes it drops.
                        if shrink { SNAPSHOT_TIMEOUT } else { QUERY_TIMEOUT },
                    )?;
                    let bytes = |k: &str| r[k].as_u64().ok_or_else(|| anyhow!("malformed reply: {r}"));
                    (bytes("old_bytes")?, bytes("new_bytes")?, r["device"].as_str().map(String::from))
                }
                None if shrink => {
                    let store = open_store(&dir, false)?;
                    let r = store.shrink_image(&name, size, None)?;
                    if store.publish_stats(&name).is_some() {
                        store.drain_to_bucket(&*store.open_image(&name)?, RESIZE_PUBLISH_TIMEOUT)?;
                    }
                    (r.old_bytes, r.new_bytes, None)
                }
                None => {
                    let store = open_store(&dir, false)?;
                    let r = store.resize_image(&name, size)?;
                    if store.publish_stats(&name).is_some() {
                        store.drain_to_bucket(&r.image, RESIZE_PUBLISH_TIMEOUT)?;
                    }
                    (r.old_bytes, r.new_bytes, None)
                }
            };
            let on = device.map(|d| format!(" ({d} too)")).unwrap_or_default();
            println!("{name}: {old} -> {new} bytes{on}");
        }
        ImageCommand::Clone { snapshot, new } => {
            match &daemon {
                Some(s) => {
                    control(s, Command::ImageClone { snapshot, name: new.clone() }, QUERY_TIMEOUT)?;
                }
                None => open_store(&dir, false)?.clone_image(&snapshot, &new)?,
            }
            println!("{new}");
        }
        ImageCommand::Rollback { image, snap } => match &daemon {
            Some(s) => {
                control(s, Command::ImageRollback { image, snap }, QUERY_TIMEOUT)?;
            }
            None => open_store(&dir, false)?.rollback_image(&image, &snap)?,
        },
        ImageCommand::Info { name, json } => {
            let info = match &daemon {
                Some(s) => control(s, Command::ImageInfo { name }, SNAPSHOT_TIMEOUT)?,
                None => {
                    let mut v = serde_json::to_value(open_store(&dir, false)?.image_info(&name)?)?;
                    v["device"] = Value::Null;
                    v
                }
            };
            print_info(&info, json)?;
        }
        ImageCommand::Export { name, file, format } => match &daemon {
            Some(s) => {
                let path = absolute(&file)?;
                control(s, Command::ImageExport { name, path, format }, TRANSFER_TIMEOUT)?;
            }
            None => crate::image_io::export(&dir, &name, &file, &format)?,
        },
        ImageCommand::Import { name, file, size } => {
            match &daemon {
                Some(s) if file.as_os_str() == "-" => {
                    bail!("store {} is served by a daemon, which cannot read this command's stdin: import a file", s.display())
                }
                Some(s) => {
                    let path = absolute(&file)?;
                    let reply =
                        control(s, Command::ImageImport { name, path, size_bytes: size }, TRANSFER_TIMEOUT)?;
                    println!("{}", reply["summary"].as_str().unwrap_or_default());
                }
                None => crate::image_io::import(&dir, &name, &file, size)?,
            }
        }
    }
    Ok(())
}

/// Bound on an import or export run by the daemon (a 1 TiB image at
/// 300 MiB/s takes about an hour).
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

/// `path` made absolute (the daemon runs elsewhere), as UTF-8.
fn absolute(path: &Path) -> Result<String> {
    let abs = std::path::absolute(path).with_context(|| format!("{}", path.display()))?;
    abs.to_str().map(String::from).ok_or_else(|| anyhow!("{} is not UTF-8", abs.display()))
}

/// Bound on publishing a grown image with a remote before the command
/// exits (as a detach does).
const RESIZE_PUBLISH_TIMEOUT: Duration = Duration::from_secs(120);

/// Bound on a snapshot (it compacts the image's log first) and on `info`
/// (it reads every manifest) through the daemon.
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);

fn print_info(info: &Value, as_json: bool) -> Result<()> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(info)?);
        return Ok(());
    }
    let text = |k: &str| info.get(k).and_then(Value::as_str).unwrap_or("-").to_string();
    let bytes = |k: &str| trace::human_bytes(info.get(k).and_then(Value::as_u64).unwrap_or(0));
    let list = |k: &str| {
        let names: Vec<&str> = info
            .get(k)
            .and_then(Value::as_array)
            .map_or(vec![], |a| a.iter().filter_map(Value::as_str).collect());
        if names.is_empty() {
            "-".to_string()
        } else {
            names.join(", ")
        }
    };
    println!("name:       {}", text("name"));
    println!("kind:       {}", text("kind"));
    println!("size:       {}", bytes("size_bytes"));
    println!("logical:    {}", bytes("logical_bytes"));
    println!("unique:     {}", bytes("unique_bytes"));
    println!("shared:     {}", bytes("shared_bytes"));
    println!("log:        {}", bytes("log_bytes"));
    println!("parent:     {}", text("parent"));
    println!("snapshots:  {}", list("snapshots"));
    println!("clones:     {}", list("clones"));
    println!("device:     {}", text("device"));
    Ok(())
}

fn print_images(rows: &Value, as_json: bool, dir: &Path) -> Result<()> {
    if as_json {
        println!("{}", serde_json::to_string_pretty(rows)?);
        return Ok(());
    }
    let rows = rows.as_array().ok_or_else(|| anyhow!("malformed image list"))?;
    let cells: Vec<[String; 4]> = rows
        .iter()
        .map(|row| {
            let name = row.get("name").and_then(Value::as_str).unwrap_or("?");
            let size = row.get("size_bytes").and_then(Value::as_u64).unwrap_or(0);
            let device = row.get("device").and_then(Value::as_str).unwrap_or("-");
            let origin = row.get("origin").and_then(Value::as_str).unwrap_or("-");
            [name.to_owned(), trace::human_bytes(size), device.to_owned(), origin.to_owned()]
        })
        .collect();
    let name_w = cells.iter().map(|c| c[0].chars().count()).chain([4]).max().unwrap_or(4);
    let size_w = cells.iter().map(|c| c[1].chars().count()).chain([4]).max().unwrap_or(4);
    let dev_w = cells.iter().map(|c| c[2].chars().count()).chain([6]).max().unwrap_or(6);
    println!("{:<name_w$}  {:>size_w$}  {:<dev_w$}  ORIGIN", "NAME", "SIZE", "DEVICE");
    for [name, size, device, origin] in &cells {
        println!("{name:<name_w$}  {size:>size_w$}  {device:<dev_w$}  {origin}");
    }
    let promised: u64 = rows
        .iter()
        .filter(|r| r.get("kind").and_then(Value::as_str) == Some("image"))
        .filter_map(|r| r.get("size_bytes").and_then(Value::as_u64))
        .sum();
    if let Some(line) = space_line(promised, dir) {
        println!("{line}");
    }
    Ok(())
}

/// What the writable images promise against the store filesystem's size
/// and free space (`None` where statvfs cannot tell).
fn space_line(promised_bytes: u64, dir: &Path) -> Option<String> {
    use cas::storage::Storage;
    let space = cas::storage::FsStorage::new().space(dir).ok().flatten().filter(|s| s.size_bytes > 0)?;
    Some(format!(
        "images promise {} on a filesystem of {} ({} free, {:.0}% used): overcommit {:.2}x",
        trace::human_bytes(promised_bytes),
        trace::human_bytes(space.size_bytes),
        trace::human_bytes(space.avail_bytes),
        space.used_pct(),
        promised_bytes as f64 / space.size_bytes as f64
    ))
}

/// Bound on a GC pass run through the daemon.
const GC_TIMEOUT: Duration = Duration::from_secs(3600);

pub fn gc(store: &Path, as_json: bool) -> Result<()> {
    let dir = store_dir(store, false)?;
    let report = match running_daemon(&dir) {
        Some(s) => control(&s, Command::Gc {}, GC_TIMEOUT)?,
        None => serde_json::to_value(open_store(&dir, false)?.gc()?)?,
    };
    if as_json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    let num = |k: &str| report.get(k).and_then(Value::as_u64).unwrap_or(0);
    println!(
        "gc: {} manifests, {} chunks scanned, {} dead, {} packs rewritten, {} packs deleted, {} reclaimed",
        num("manifests"),
        num("chunks_scanned"),
        num("chunks_dead"),
        num("packs_rewritten"),
        num("packs_deleted"),
        match report.get("bytes_reclaimed").and_then(Value::as_i64).unwrap_or(0) {
            n if n < 0 => format!("-{}", trace::human_bytes(n.unsigned_abs())),
            n => trace::human_bytes(n.unsigned_abs()),
        }
    );
    Ok(())
}

/// Where `stats` asks, and for which image: `-n ID` names a device, whose
/// exported target data says which daemon and image serve it.
fn stats_target(store: &Path, id: Option<u32>) -> Result<(PathBuf, Option<String>)> {
    match id {
        None => {
            let dir = store_dir(store, false)?;
            let socket = running_daemon(&dir)
                .ok_or_else(|| anyhow!("no casblk daemon is serving store {}", dir.display()))?;
            Ok((socket, None))
        }
        Some(id) => {
            let target = crate::devices::target_data(id)?;
            let cas = target.get("cas").ok_or_else(|| {
                anyhow!("ublk device {id} is not a casblk store device (raw mode has no stats)")
            })?;
            let socket =
                cas.get("socket").and_then(Value::as_str).ok_or_else(|| anyhow!("device {id}: no socket"))?;
            let image = cas.get("image").and_then(Value::as_str).map(str::to_owned);
            Ok((PathBuf::from(socket), image))
        }
    }
}

pub fn stats(store: &Path, args: &StatsArgs) -> Result<()> {
    let (socket, image) = stats_target(store, args.id)?;
    let fetch = || {
        crate::control_socket::query_snapshot(&socket, image.as_deref(), QUERY_TIMEOUT)
            .map_err(|e| anyhow!("stats from {}: {e}", socket.display()))
    };
    let Some(secs) = args.watch else {
        let snap = fetch()?;
        if args.openmetrics {
            print!("{}", crate::metrics::render(&snap).map_err(|e| anyhow!("metrics: {e}"))?);
        } else if args.json {
            println!("{}", serde_json::to_string_pretty(&snap.to_value())?);
        } else {
            print!("{}", trace::render_table(&snap));
        }
        return Ok(());
    };
    if secs == 0 {
        bail!("--watch needs an interval of at least 1 second");
    }
    let mut previous = fetch()?;
    loop {
        std::thread::sleep(Duration::from_secs(secs));
        let current = fetch()?;
        if args.json {
            println!("{}", serde_json::to_string(&current.to_value())?);
        } else {
            // Clear the screen and home the cursor, as watch(1) does.
            print!("\x1b[2J\x1b[H{}", trace::render_table_since(&previous, &current));
        }
        previous = current;
    }
}
