//! The member's side of a collective flush: map the log's directory to each I/O server's
//! subfiles, send each server its part, then answer the server's pulls until it reports its
//! part written and synced (docs/architecture.md "ENWRICH", docs/protocol.md).

use super::cache::{LogCache, LogEntry};
use crate::error::{unexpected, ClientError};
use crate::replicas::{chain_route, destination, Access, ChainViews};
use crate::transport::Transport;
use bytes::{Bytes, BytesMut};
use flotilla_proto::{EntryInfo, FlushEntry, FlushJob, IoReply, IoRequest, PullRange};
use flotilla_types::{Layout, SubfileIndex, TargetId};
use std::collections::BTreeMap;

/// Where each subfile's part goes: (server, target), by subfile.
pub(crate) type Places = Vec<(String, TargetId)>;

/// Each subfile's server and target: its own for a plain subfile; for a replicated one
/// (issue 32) its chain's head as this client knows it (refetched when stale): the head
/// pulls the data and applies it through the chain.
pub(crate) async fn places(
    transport: &Transport,
    views: &ChainViews,
    entry: &EntryInfo,
) -> Result<Places, ClientError> {
    let mut places = Vec::with_capacity(entry.subfiles.len());
    for place in &entry.subfiles {
        let Some(chain) = &place.chain else {
            places.push((place.server.clone(), place.target));
            continue;
        };
        // The entry's view only where none is kept: learning it again would clear the
        // staleness a failed flush marked (and route to a dead head forever).
        if views.get(chain.chain).is_none() {
            views.learn(chain.clone());
        }
        let head = destination(transport, views, &chain_route(chain.chain), Access::Change).await?;
        let target = head.chained.map_or(place.target, |member| member.target);
        places.push((head.addr, target));
    }
    Ok(places)
}

/// Each server's directory part (every server holding a subfile of the file, at `places`,
/// gets one, empty or not: a server waits for every member), entries of `file` only.
pub(crate) fn directories(
    entry: &EntryInfo,
    places: &Places,
    log: &[LogEntry],
) -> Result<BTreeMap<String, Vec<FlushEntry>>, ClientError> {
    let layout = entry.layout.unwrap_or(Layout::Explicit);
    let subfiles = entry.subfiles.len() as u32;
    let mut parts: BTreeMap<String, Vec<FlushEntry>> =
        places.iter().map(|(server, _)| (server.clone(), Vec::new())).collect();
    for logged in log.iter().filter(|l| l.file == entry.id) {
        layout.for_each_extent(entry.file_id(), subfiles, logged.offset, logged.length, |extent| {
            let Some((server, target)) = places.get(extent.subfile as usize) else { return };
            if let Some(part) = parts.get_mut(server) {
                part.push(FlushEntry {
                    target: *target,
                    subfile: SubfileIndex(extent.subfile),
                    offset: extent.subfile_offset,
                    length: extent.length,
                    timestamp: logged.timestamp,
                    cache_offset: logged.cache_offset + (extent.linear_offset - logged.offset),
                });
            }
        })?;
    }
    Ok(parts)
}

/// The bytes of `ranges`, packed in order; a range outside the logged data is refused.
pub(crate) fn gather(cache: &LogCache, ranges: &[PullRange], server: &str) -> Result<Bytes, ClientError> {
    let total: u64 = ranges.iter().fold(0u64, |sum, r| sum.saturating_add(r.length));
    if total > cache.data_bytes() {
        return Err(ClientError::Enwrich(format!(
            "server {server} pulled {total} bytes, more than the {} the log cache holds",
            cache.data_bytes()
        )));
    }
    let mut packed = BytesMut::with_capacity(total as usize);
    for range in ranges {
        let bytes = cache.range(range.cache_offset, range.length).ok_or_else(|| {
            ClientError::Enwrich(format!(
                "server {server} pulled bytes {}..+{} outside the log cache",
                range.cache_offset, range.length
            ))
        })?;
        packed.extend_from_slice(bytes);
    }
    Ok(packed.freeze())
}

/// What one server reported: its address, its boot epoch, the bytes it wrote.
pub(crate) type ServerDone = (String, u64, u64);

/// Flushes the log's entries for `entry` as member `job.member`: every server's part, all at
/// once; what each server reported. Fails naming the first server (or member, as the server
/// reports) that failed.
/// A replicated file's chains are refetched after a failed flush (a head may have died).
pub(crate) async fn flush(
    transport: &Transport,
    views: &ChainViews,
    entry: &EntryInfo,
    job: &FlushJob,
    cache: &LogCache,
) -> Result<Vec<ServerDone>, ClientError> {
    let outcome = async {
        let places = places(transport, views, entry).await?;
        let parts = directories(entry, &places, cache.entries())?;
        let calls =
            parts.into_iter().map(|(server, entries)| flush_server(transport, server, job, entries, cache));
        futures::future::try_join_all(calls).await
    }
    .await;
    if outcome.is_err() {
        for chain in entry.subfiles.iter().filter_map(|place| place.chain.as_ref()) {
            views.mark_stale(chain.chain);
        }
    }
    outcome
}

async fn flush_server(
    transport: &Transport,
    addr: String,
    job: &FlushJob,
    entries: Vec<FlushEntry>,
    cache: &LogCache,
) -> Result<ServerDone, ClientError> {
    let server = transport.server(&addr).await?;
    let directory = IoRequest::FlushDirectory { job: job.clone(), entries };
    match transport.io_call(&server, &directory, Bytes::new(), 0).await?.0 {
        IoReply::Done { .. } => {}
        other => return Err(unexpected("flush directory", &other)),
    }
    let mut reply =
        transport.io_call(&server, &IoRequest::FlushPull { job: job.clone() }, Bytes::new(), 0).await?.0;
    loop {
        match reply {
            IoReply::Pull { ranges } => {
                let data = gather(cache, &ranges, &addr)?;
                let bytes = data.len() as u64;
                let answer = IoRequest::FlushData { job: job.clone(), ranges };
                reply = transport.io_call(&server, &answer, data, bytes).await?.0;
            }
            IoReply::Flushed { bytes } => return Ok((addr, server.epoch, bytes)),
            other => return Err(unexpected("flush pull", &other)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flotilla_proto::SubfilePlace;
    use flotilla_types::{Attributes, FileKind, TargetId};

    fn entry(servers: &[&str]) -> EntryInfo {
        EntryInfo {
            id: 5,
            attrs: Attributes {
                kind: FileKind::File,
                mode: 0o644,
                uid: 0,
                gid: 0,
                size_bytes: 0,
                nlink: 1,
                atime_ns: 0,
                mtime_ns: 0,
                ctime_ns: 0,
                rdev: 0,
            },
            layout: Some(Layout::Stripe { unit_bytes: 10, count: 0 }),
            subfiles: servers
                .iter()
                .enumerate()
                .map(|(i, s)| SubfilePlace {
                    target: TargetId(i as u64 + 1),
                    server: s.to_string(),
                    up: true,
                    chain: None,
                })
                .collect(),
            symlink: None,
            capability: None,
            no_overlap: false,
            replicas: 1,
        }
    }

    #[test]
    fn every_server_gets_a_part_and_every_byte_one_place() {
        let file = entry(&["a", "b", "a"]);
        let log = [
            LogEntry { file: 5, timestamp: 1, offset: 5, length: 30, cache_offset: 100 },
            LogEntry { file: 6, timestamp: 2, offset: 0, length: 30, cache_offset: 0 },
        ];
        let places: Places = file.subfiles.iter().map(|p| (p.server.clone(), p.target)).collect();
        let parts = directories(&file, &places, &log).unwrap();
        assert_eq!(parts.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        let all: Vec<FlushEntry> = parts.values().flatten().copied().collect();
        assert_eq!(all.iter().map(|e| e.length).sum::<u64>(), 30, "file 6's entry is not file 5's");
        let mut caches: Vec<u64> = all.iter().map(|e| e.cache_offset).collect();
        caches.sort_unstable();
        assert_eq!(caches, vec![100, 105, 115, 125]);
        assert!(directories(&file, &places, &[]).unwrap().values().all(|p| p.is_empty()));
    }

    #[test]
    fn pulls_outside_the_log_are_refused() {
        let mut cache = LogCache::new(4800, 0.1);
        cache.append(1, 0, b"hello world", 1);
        let ranges = [PullRange { cache_offset: 6, length: 5 }, PullRange { cache_offset: 0, length: 5 }];
        assert_eq!(&gather(&cache, &ranges, "s").unwrap()[..], b"worldhello");
        let outside = [PullRange { cache_offset: 8, length: 5 }];
        assert!(gather(&cache, &outside, "s")
            .unwrap_err()
            .to_string()
            .contains("server s pulled bytes 8..+5"));
    }
}
