//! The control plane: every command a client sends a store daemon, as one
//! typed enum, and the protocol version they are spoken in.
//!
//! On the wire a command rides in the control socket's framing
//! (`trace::stats::Request::Control`):
//!
//! ```text
//! {"cmd":"control","action":"image_create","args":{"name":"vm","size_bytes":1073741824},"v":1}
//! ```
//!
//! `action` and `args` are [`Command`]'s serde form; `v` is the protocol
//! version. A request without `v` (sent by a casblk from before versions,
//! which `casblk upgrade` may still meet) speaks version 1. A version the
//! daemon does not speak gets an error reply naming the versions it does,
//! so a newer client never has a request half-understood. A daemon of
//! this version ignores fields it does not know in the framing, and so do
//! older ones: `v` was added without breaking them.
//!
//! Replies stay JSON values, built and read where each command lives.

use crate::targets::cas::AddImageArgs;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The control protocol version this build sends.
pub const PROTOCOL_VERSION: u32 = 1;
/// Every version this build's daemon understands.
pub const VERSIONS_UNDERSTOOD: &[u32] = &[1];

/// A command to a store daemon.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "action", content = "args", rename_all = "snake_case")]
pub enum Command {
    /// Is a daemon serving this store? Replies `{"store": DIR}`.
    Ping {},
    /// Attach (or recover) a device for an image. Replies `{"device": PATH}`.
    /// (Boxed: it is by far the largest command.)
    Add(Box<AddImageArgs>),
    /// Replies `{"created": NAME}`.
    ImageCreate { name: String, size_bytes: u64 },
    /// Refused while the image is attached. Replies `{"removed": NAME}`.
    ImageRemove { name: String },
    /// Replies `[{"name", "size_bytes", "device", "kind", "origin"}]`.
    ImageList {},
    /// Snapshot image `image` as `IMAGE@SNAP` (allowed while attached).
    /// Replies `{"snapshot": NAME}`.
    ImageSnapshot { image: String, snap: String },
    /// A writable image from a snapshot. Replies `{"cloned": NAME}`.
    ImageClone { snapshot: String, name: String },
    /// Return a detached image to its snapshot. Replies `{"rolled_back": IMAGE}`.
    ImageRollback { image: String, snap: String },
    /// Replies `cas::store::ImageDetail` with `"device"`.
    ImageInfo { name: String },
    /// Grow an image; an attached one online, where the driver can.
    /// Replies `{"resized": NAME, "old_bytes", "new_bytes", "device"}`.
    ImageResize {
        name: String,
        size_bytes: u64,
        /// Shrink a detached image (refused when attached).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        shrink: bool,
    },
    /// Import a raw or qcow2 file (an absolute path the daemon reads) as a
    /// new image. Replies `{"imported": NAME, "summary": TEXT}`.
    ImageImport { name: String, path: String, size_bytes: Option<u64> },
    /// Export a detached image to a file (an absolute path the daemon
    /// writes), `format` raw or qcow2. Replies `{"exported": NAME}`.
    ImageExport { name: String, path: String, format: String },
    /// Change (or, with an empty change, read) the IO limits of an
    /// attached image's device. Replies `{"image", "limits", "device"}`.
    ImageLimits {
        name: String,
        #[serde(default)]
        change: crate::limits::LimitChange,
    },
    /// Starts a scrub pass in the background (one at a time). Replies
    /// `{"started": SCOPE, "passes": N}` (passes finished before it).
    Scrub {
        image: Option<String>,
        rate_bytes_per_sec: u64,
        /// The bucket's copies instead of the local packs.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        bucket: bool,
    },
    /// Replies `{"running": SCOPE|null, "progress": {...}, "last": REPORT|null}`.
    ScrubStatus {},
    /// Replies the GC report.
    Gc {},
    /// Live upgrade: flush every image, reply `{"devices", "service",
    /// "pid"}`, exit leaving the devices quiesced.
    Handoff {},
}

impl Command {
    /// The framed request for this command, in this build's version.
    pub fn request(&self) -> trace::stats::Request {
        let mut v = serde_json::to_value(self).expect("a command serializes");
        let action = v["action"].as_str().expect("a command has an action").to_string();
        let args = v.get_mut("args").map(Value::take).unwrap_or_else(|| json!({}));
        trace::stats::Request::control(&action, args, PROTOCOL_VERSION)
    }

    /// Decodes the fields of a framed control request, refusing a version
    /// this daemon does not speak and naming the ones it does.
    pub fn decode(action: &str, args: &Value, version: Option<u32>) -> Result<Command, String> {
        let version = version.unwrap_or(1);
        if !VERSIONS_UNDERSTOOD.contains(&version) {
            return Err(format!(
                "control protocol version {version} is not understood by this casblk daemon, which speaks \
                 {VERSIONS_UNDERSTOOD:?}: use a casblk of the daemon's version, or `casblk upgrade` the daemon"
            ));
        }
        let args = if args.is_null() { json!({}) } else { args.clone() };
        serde_json::from_value(json!({ "action": action, "args": args }))
            .map_err(|e| format!("{action}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn framed(c: &Command) -> Value {
        serde_json::to_value(c.request()).unwrap()
    }

    fn decode_framed(v: &Value) -> Result<Command, String> {
        match trace::stats::parse_request(v.to_string().as_bytes())? {
            trace::stats::Request::Control { action, args, v } => Command::decode(&action, &args, v),
            other => Err(format!("not a control request: {other:?}")),
        }
    }

    #[test]
    fn commands_keep_the_wire_names_older_daemons_and_clients_use() {
        let wire = [
            (Command::Ping {}, r#"{"action":"ping","args":{},"cmd":"control","v":1}"#),
            (Command::ImageList {}, r#"{"action":"image_list","args":{},"cmd":"control","v":1}"#),
            (Command::Gc {}, r#"{"action":"gc","args":{},"cmd":"control","v":1}"#),
            (Command::Handoff {}, r#"{"action":"handoff","args":{},"cmd":"control","v":1}"#),
            (
                Command::ImageCreate { name: "vm".into(), size_bytes: 4096 },
                r#"{"action":"image_create","args":{"name":"vm","size_bytes":4096},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageRemove { name: "vm".into() },
                r#"{"action":"image_remove","args":{"name":"vm"},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageSnapshot { image: "vm".into(), snap: "s".into() },
                r#"{"action":"image_snapshot","args":{"image":"vm","snap":"s"},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageClone { snapshot: "vm@s".into(), name: "c".into() },
                r#"{"action":"image_clone","args":{"name":"c","snapshot":"vm@s"},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageRollback { image: "vm".into(), snap: "s".into() },
                r#"{"action":"image_rollback","args":{"image":"vm","snap":"s"},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageResize { name: "vm".into(), size_bytes: 8192, shrink: false },
                r#"{"action":"image_resize","args":{"name":"vm","size_bytes":8192},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageResize { name: "vm".into(), size_bytes: 4096, shrink: true },
                r#"{"action":"image_resize","args":{"name":"vm","shrink":true,"size_bytes":4096},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageInfo { name: "vm".into() },
                r#"{"action":"image_info","args":{"name":"vm"},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageImport { name: "vm".into(), path: "/x.qcow2".into(), size_bytes: None },
                r#"{"action":"image_import","args":{"name":"vm","path":"/x.qcow2","size_bytes":null},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageExport { name: "vm".into(), path: "/x.raw".into(), format: "raw".into() },
                r#"{"action":"image_export","args":{"format":"raw","name":"vm","path":"/x.raw"},"cmd":"control","v":1}"#,
            ),
            (
                Command::ImageLimits {
                    name: "vm".into(),
                    change: crate::limits::LimitChange {
                        write_iops: crate::limits::Setting::Set { per_sec: 300, burst: None },
                        read_iops: crate::limits::Setting::Remove,
                        ..Default::default()
                    },
                },
                r#"{"action":"image_limits","args":{"name":"vm","change":{"clear":false,"read_iops":"remove","write_iops":{"set":{"per_sec":300,"burst":null}}}},"cmd":"control","v":1}"#,
            ),
        ];
        for (c, text) in wire {
            let want: Value = serde_json::from_str(text).unwrap();
            assert_eq!(framed(&c), want);
            let back = decode_framed(&want).unwrap();
            assert_eq!(framed(&back), want, "round trip");
        }
    }

    #[test]
    fn add_carries_the_device_shape_as_four_flat_fields() {
        let old = serde_json::json!({"cmd": "control", "action": "add", "v": 1, "args": {
            "image": "vm", "id": -1, "queues": 2, "depth": 64, "io_buf_bytes": 524288, "poll_us": 0}});
        let Command::Add(args) = decode_framed(&old).unwrap() else { panic!("not an add") };
        let want = crate::device::Shape { queues: 2, depth: 64, io_buf_bytes: 524288, poll_us: 0 };
        assert_eq!((args.image.as_str(), args.id, args.shape, args.recover), ("vm", -1, want, false));
        let back = framed(&Command::Add(args.clone()));
        assert_eq!(back["args"]["queues"], 2);
        assert_eq!(back["args"]["io_buf_bytes"], 524288);
        assert!(back["args"].get("shape").is_none(), "{back}");
        assert!(back["args"].get("limits").is_none(), "no limits: the add an older daemon reads: {back}");
        assert!(
            back["args"].get("policy").is_none(),
            "the default policy: the add an older daemon reads: {back}"
        );
        let limited = AddImageArgs {
            limits: sched::Limits { read_iops: Some(sched::RateLimit::new(500)), ..Default::default() },
            ..match decode_framed(&old).unwrap() {
                Command::Add(a) => *a,
                _ => unreachable!(),
            }
        };
        let back = framed(&Command::Add(Box::new(limited)));
        assert_eq!(back["args"]["limits"], serde_json::json!({"read_iops": {"per_sec": 500, "burst": 50}}));
    }

    #[test]
    fn requests_without_a_version_speak_version_one() {
        // As sent by casblk before the protocol had versions.
        let old = serde_json::json!({"cmd": "control", "action": "image_create", "args": {"name": "a", "size_bytes": 8192}});
        match decode_framed(&old).unwrap() {
            Command::ImageCreate { name, size_bytes } => assert_eq!((name.as_str(), size_bytes), ("a", 8192)),
            other => panic!("{other:?}"),
        }
        let no_args = serde_json::json!({"cmd": "control", "action": "ping"});
        assert!(matches!(decode_framed(&no_args).unwrap(), Command::Ping {}));
    }

    #[test]
    fn unknown_versions_actions_and_arguments_are_refused_by_name() {
        let newer = serde_json::json!({"cmd": "control", "action": "ping", "args": {}, "v": 2});
        let e = decode_framed(&newer).unwrap_err();
        assert!(e.contains("version 2") && e.contains("[1]"), "{e}");
        let e =
            decode_framed(&serde_json::json!({"cmd": "control", "action": "fly", "args": {}})).unwrap_err();
        assert!(e.contains("fly") && e.contains("image_create"), "{e}");
        let bad = serde_json::json!({"cmd": "control", "action": "image_create", "args": {"name": "a"}});
        let e = decode_framed(&bad).unwrap_err();
        assert!(e.contains("size_bytes"), "{e}");
        let bad = serde_json::json!({"cmd": "control", "action": "image_create", "args": {"name": 5, "size_bytes": 1}});
        assert!(decode_framed(&bad).is_err());
    }
}
