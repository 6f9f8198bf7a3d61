//! A store's bucket, as `casblk remote set` records it in `DIR/REMOTE`:
//! where the bucket is and which file holds the key. The secret itself is
//! never stored there; it is read from the key file (or the environment)
//! each time the store opens.
//!
//! ```text
//! DIR/REMOTE (replaced whole, atomically):
//!  0 magic "CASREMOT" | 8 version u32 | 12 reserved u32
//!  then strings (u16 length, UTF-8): bucket, prefix, region, key file,
//!  endpoint count u16 and each endpoint; crc32c of everything before it
//! key file: the key id on its first line, the secret on its second
//!  (else AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)
//! ```

use crate::RemoteConfig;
use cas::format::{self, Encoder};
use cas::{Error, Result};
use std::path::{Path, PathBuf};

/// The file's name in the store directory.
pub const REMOTE_FILE: &str = "REMOTE";
const MAGIC: [u8; 8] = *b"CASREMOT";
const VERSION: u32 = 1;
/// Largest settings file read.
const MAX_BYTES: u64 = 64 << 10;

/// See the module docs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteSettings {
    pub endpoints: Vec<String>,
    pub bucket: String,
    /// Empty, or ending in `/`.
    pub prefix: String,
    pub region: String,
    pub key_file: Option<PathBuf>,
}

fn put_str(e: &mut Encoder, s: &str) {
    let len = u16::try_from(s.len()).expect("settings strings are checked to fit");
    e.u16(len).bytes(s.as_bytes());
}

impl RemoteSettings {
    /// Checks what a user gave: a bucket name, endpoints that are URLs,
    /// a prefix ending in `/`.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidArgument(m));
        if self.endpoints.is_empty() {
            return bad("give at least one endpoint (--endpoint http://HOST:PORT)".into());
        }
        if let Some(e) =
            self.endpoints.iter().find(|e| !(e.starts_with("http://") || e.starts_with("https://")))
        {
            return bad(format!("endpoint '{e}' is not an http:// or https:// URL"));
        }
        if self.bucket.is_empty() || self.bucket.contains('/') {
            return bad(format!("bucket '{}' must be a bucket name (no '/')", self.bucket));
        }
        if !(self.prefix.is_empty() || self.prefix.ends_with('/')) {
            return bad(format!("prefix '{}' must end in '/'", self.prefix));
        }
        let key = self.key_file.as_ref().map_or(String::new(), |p| p.display().to_string());
        let strings = [&self.bucket, &self.prefix, &self.region, &key];
        if strings.iter().chain(self.endpoints.iter().collect::<Vec<_>>().iter()).any(|s| s.len() > 4096) {
            return bad("a remote setting is longer than 4096 bytes".into());
        }
        Ok(())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut e = Encoder::default();
        e.bytes(&MAGIC).u32(VERSION).u32(0);
        put_str(&mut e, &self.bucket);
        put_str(&mut e, &self.prefix);
        put_str(&mut e, &self.region);
        put_str(&mut e, &self.key_file.as_ref().map_or(String::new(), |p| p.display().to_string()));
        e.u16(u16::try_from(self.endpoints.len()).expect("checked"));
        for ep in &self.endpoints {
            put_str(&mut e, ep);
        }
        e.seal();
        e.buf
    }

    /// Decodes and checks the file's bytes; never panics.
    pub fn decode(buf: &[u8], path: &Path) -> Result<RemoteSettings> {
        let corrupt = |detail: String| Error::Corruption { path: path.to_path_buf(), offset: 0, detail };
        let (_, mut d) = format::open_sealed(buf, &MAGIC, "remote settings file", VERSION, path)?;
        let short = || corrupt("remote settings are cut short".into());
        if d.u32().ok_or_else(short)? != 0 {
            return Err(corrupt("reserved bytes are not zero".into()));
        }
        let mut s = || -> Result<String> {
            let n = d.u16().ok_or_else(short)? as usize;
            let b = d.bytes(n).ok_or_else(short)?;
            String::from_utf8(b.to_vec()).map_err(|_| corrupt("a remote setting is not UTF-8".into()))
        };
        let (bucket, prefix, region, key) = (s()?, s()?, s()?, s()?);
        let n = d.u16().ok_or_else(short)?;
        let mut endpoints = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let len = d.u16().ok_or_else(short)? as usize;
            let b = d.bytes(len).ok_or_else(short)?;
            endpoints
                .push(String::from_utf8(b.to_vec()).map_err(|_| corrupt("an endpoint is not UTF-8".into()))?);
        }
        if d.remaining() != 0 {
            return Err(corrupt(format!("{} bytes past the settings", d.remaining())));
        }
        let key_file = (!key.is_empty()).then(|| PathBuf::from(key));
        Ok(RemoteSettings { endpoints, bucket, prefix, region, key_file })
    }

    /// The settings of the store in `dir`, if it has a remote.
    pub fn read(dir: &Path) -> Result<Option<RemoteSettings>> {
        let fs = cas::storage::FsStorage::new();
        let path = dir.join(REMOTE_FILE);
        match cas::storage::read_small(&fs, &path, MAX_BYTES, "remote settings")? {
            Some(buf) => RemoteSettings::decode(&buf, &path).map(Some),
            None => Ok(None),
        }
    }

    /// Records the settings in `dir`, atomically and durably.
    pub fn write(&self, dir: &Path) -> Result<()> {
        self.validate()?;
        cas::storage::write_atomic(&cas::storage::FsStorage::new(), dir, REMOTE_FILE, &self.encode())
    }

    /// The client configuration: the key id and secret from the key file,
    /// or from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY.
    pub fn config(&self) -> Result<RemoteConfig> {
        let (key_id, secret) = match &self.key_file {
            Some(f) => {
                let text = std::fs::read_to_string(f).map_err(|e| Error::io(f.clone(), e))?;
                let mut lines = text.lines().map(str::trim).filter(|l| !l.is_empty());
                match (lines.next(), lines.next()) {
                    (Some(id), Some(secret)) => (id.to_string(), secret.to_string()),
                    _ => {
                        return Err(Error::InvalidArgument(format!(
                            "key file {} must hold the key id on its first line and the secret on its second",
                            f.display()
                        )))
                    }
                }
            }
            None => {
                let var = |k: &str| {
                    std::env::var(k).map_err(|_| {
                        Error::InvalidArgument(format!(
                            "no key file in the remote settings, and {k} is not set"
                        ))
                    })
                };
                (var("AWS_ACCESS_KEY_ID")?, var("AWS_SECRET_ACCESS_KEY")?)
            }
        };
        let region = if self.region.is_empty() { "garage" } else { &self.region };
        let mut cfg = RemoteConfig::new(self.endpoints.clone(), &self.bucket, region, &key_id, &secret);
        cfg.prefix = self.prefix.clone();
        Ok(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RemoteSettings {
        RemoteSettings {
            endpoints: vec!["http://127.0.0.1:3900".into(), "http://127.0.0.1:3910".into()],
            bucket: "casblk".into(),
            prefix: "site-a/".into(),
            region: "garage".into(),
            key_file: Some("/etc/casblk/key".into()),
        }
    }

    #[test]
    fn round_trips_and_refuses_damage() {
        let s = sample();
        let buf = s.encode();
        let p = Path::new("/REMOTE");
        assert_eq!(RemoteSettings::decode(&buf, p).unwrap(), s);
        for i in 0..buf.len() {
            let mut bad = buf.clone();
            bad[i] ^= 0x04;
            assert!(RemoteSettings::decode(&bad, p).is_err(), "flip at {i} accepted");
        }
        for cut in 0..buf.len() {
            assert!(RemoteSettings::decode(&buf[..cut], p).is_err(), "cut at {cut} accepted");
        }
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        let cases = [
            (RemoteSettings { endpoints: vec![], ..sample() }, "endpoint"),
            (RemoteSettings { endpoints: vec!["127.0.0.1:3900".into()], ..sample() }, "http://"),
            (RemoteSettings { bucket: "a/b".into(), ..sample() }, "bucket"),
            (RemoteSettings { prefix: "p".into(), ..sample() }, "prefix"),
        ];
        for (s, want) in cases {
            let e = s.validate().unwrap_err().to_string();
            assert!(e.contains(want), "{e}");
        }
    }
}
