//! The warm cache file: the last refreshed map, so a restarted client
//! catches up with a delta (`KW.MAP SINCE <its version>`) instead of
//! loading the whole map.
//!
//! Format: `KWCACHE1`, the CRC-32C of the rest (4 bytes, big-endian), then
//! the map in [`keyway_map::encode_map`]'s encoding. A file that is absent,
//! truncated, fails its checksum, does not decode or does not validate is
//! ignored (with a warning): it only ever saves a round trip's worth of
//! bytes, so it is never worth failing a client over.
//!
//! Writes are atomic (a temporary file in the same directory, fsynced, then
//! renamed over the file) and throttled: after a refresh the map is saved
//! only if the last save was at least `cache_save_interval_ms` ago; a
//! refresh inside the interval leaves the file one refresh behind (the next
//! refresh, or [`crate::Client::save_cache`], catches it up). Saves after a
//! refresh run on a blocking thread and are not awaited.

use keyway_map::PartitionMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 8] = b"KWCACHE1";
const CRC: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// The file's bytes for `map`.
pub fn encode(map: &PartitionMap) -> Vec<u8> {
    let body = keyway_map::encode_map(map);
    let mut out = Vec::with_capacity(body.len() + 12);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&CRC.checksum(&body).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

/// The map in the file's bytes, validated, or why not.
pub fn decode(bytes: &[u8]) -> Result<PartitionMap, String> {
    let rest = bytes
        .strip_prefix(MAGIC)
        .ok_or("not a Keyway map cache file")?;
    if rest.len() < 4 {
        return Err("truncated".into());
    }
    let (sum, body) = rest.split_at(4);
    if CRC.checksum(body).to_be_bytes() != sum {
        return Err("checksum mismatch".into());
    }
    let map = keyway_map::decode_map(body).map_err(|e| e.to_string())?;
    map.validate().map_err(|e| format!("invalid map: {e}"))?;
    Ok(map)
}

/// Reads the file: `None` when it is absent or unusable (warned).
pub fn load(path: &Path) -> Option<PartitionMap> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), %e, "cannot read the map cache file; ignoring it");
            return None;
        }
    };
    match decode(&bytes) {
        Ok(map) => Some(map),
        Err(why) => {
            tracing::warn!(path = %path.display(), %why, "ignoring a corrupt map cache file");
            None
        }
    }
}

/// Atomically replaces the file with `map`: temporary file, fsync, rename.
pub fn save(path: &Path, map: &PartitionMap) -> std::io::Result<()> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("cache_file has no file name"))?;
    let mut tmp_name = name.to_os_string();
    tmp_name.push(format!(".tmp.{}", std::process::id()));
    let tmp = path.with_file_name(tmp_name);
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(&encode(map))?;
    file.sync_all()?;
    drop(file);
    std::fs::rename(&tmp, path)
}

/// A client's cache file and its save throttle.
#[derive(Debug)]
pub struct WarmFile {
    path: PathBuf,
    interval: Duration,
    last_save: Mutex<Option<Instant>>,
    /// Serialises writers (they share the temporary file name).
    writing: Arc<Mutex<()>>,
}

impl WarmFile {
    pub fn new(path: PathBuf, interval_ms: u64) -> Self {
        WarmFile {
            path,
            interval: Duration::from_millis(interval_ms),
            last_save: Mutex::new(None),
            writing: Arc::new(Mutex::new(())),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// After a refresh: saves `map` in the background unless the last save
    /// was within the interval (or there was none yet: `connect` saves, and
    /// waits for it, once its first refresh is done).
    pub fn save_throttled(&self, map: Arc<PartitionMap>) {
        let now = Instant::now();
        {
            let mut last = self.last_save.lock().unwrap_or_else(|e| e.into_inner());
            if last.is_none_or(|t| now.duration_since(t) < self.interval) {
                return;
            }
            *last = Some(now);
        }
        let (path, writing) = (self.path.clone(), self.writing.clone());
        tokio::task::spawn_blocking(move || write_logged(&path, &writing, &map));
    }

    /// Saves `map` now and waits for it.
    pub async fn save_now(&self, map: Arc<PartitionMap>) -> std::io::Result<()> {
        *self.last_save.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
        let (path, writing) = (self.path.clone(), self.writing.clone());
        tokio::task::spawn_blocking(move || {
            let _one = writing.lock().unwrap_or_else(|e| e.into_inner());
            save(&path, &map)
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

fn write_logged(path: &Path, writing: &Mutex<()>, map: &PartitionMap) {
    let _one = writing.lock().unwrap_or_else(|e| e.into_inner());
    if let Err(e) = save(path, map) {
        tracing::warn!(path = %path.display(), %e, "cannot save the map cache file");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keyway_map::{NodeId, NodeInfo};

    #[test]
    fn round_trips_and_refuses_every_corruption() {
        let nodes = vec![NodeInfo::up(NodeId(1), "h:1".into())];
        let map = PartitionMap::bootstrap(&nodes, 3).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("map.cache");
        assert_eq!(load(&path), None, "absent");
        save(&path, &map).unwrap();
        assert_eq!(load(&path), Some(map.clone()));
        let good = std::fs::read(&path).unwrap();
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..good.len() {
            let mut bad = good.clone();
            bad[i] ^= 0x01;
            assert!(decode(&bad).is_err(), "bit flipped in byte {i}");
        }
        std::fs::write(&path, b"garbage").unwrap();
        assert_eq!(load(&path), None);
        // No temporary file is left behind.
        save(&path, &map).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
