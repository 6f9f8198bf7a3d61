//! The store's bucket from the command line: `casblk remote set|show`
//! record and print `DIR/REMOTE` (`casblk_remote::settings`), and every
//! command and the daemon open the store with that bucket when the file
//! exists (a probe first: a bad setup is one line naming the problem).

use crate::cli::RemoteCommand;
use anyhow::{anyhow, Result};
use casblk_remote::{RemoteSettings, S3Objects};
use std::path::Path;
use std::sync::Arc;

/// The `StoreOptions::remote` of the store in `dir`: its bucket, connected
/// and probed, if it has one.
pub fn store_remote(dir: &Path) -> Result<cas::store::StoreRemote> {
    let Some(settings) = RemoteSettings::read(dir).map_err(|e| anyhow!("store {}: {e}", dir.display()))?
    else {
        return Ok(cas::store::StoreRemote(None));
    };
    let cfg = settings.config().map_err(|e| anyhow!("store {}: remote: {e}", dir.display()))?;
    let objects = S3Objects::open(cfg).map_err(|e| anyhow!("store {}: {e}", dir.display()))?;
    let opts = cas::bucket::RemoteOptions::new(Arc::new(objects));
    Ok(cas::store::StoreRemote(Some(opts)))
}

pub fn command(store: &Path, cmd: RemoteCommand) -> Result<()> {
    match cmd {
        RemoteCommand::Set { endpoint, bucket, prefix, region, key_file } => {
            if !store.join("STORE").exists() {
                return Err(anyhow!("no casblk store at {} (create an image first)", store.display()));
            }
            let endpoints = endpoint.iter().flat_map(|e| e.split(',')).map(str::to_string).collect();
            let key_file = match key_file {
                Some(f) => {
                    Some(std::fs::canonicalize(&f).map_err(|e| anyhow!("key file {}: {e}", f.display()))?)
                }
                None => None,
            };
            let settings = RemoteSettings { endpoints, bucket, prefix, region, key_file };
            settings.validate()?;
            // Reach the bucket before recording it: a wrong setting fails here.
            let cfg = settings.config()?;
            let objects = S3Objects::open(cfg).map_err(|e| anyhow!("{e}"))?;
            settings.write(store)?;
            println!("store {} uses {}", store.display(), cas::objects::Objects::describe(&objects));
        }
        RemoteCommand::Show { json } => match RemoteSettings::read(store)? {
            None => println!("store {} has no remote", store.display()),
            Some(s) if json => println!(
                "{}",
                serde_json::json!({
                    "endpoints": s.endpoints,
                    "bucket": s.bucket,
                    "prefix": s.prefix,
                    "region": s.region,
                    "key_file": s.key_file,
                })
            ),
            Some(s) => {
                println!("endpoints: {}", s.endpoints.join(","));
                println!("bucket:    s3://{}/{}", s.bucket, s.prefix);
                println!("region:    {}", s.region);
                match &s.key_file {
                    Some(f) => println!("key file:  {}", f.display()),
                    None => println!("key:       AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"),
                }
            }
        },
    }
    Ok(())
}
