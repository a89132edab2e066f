//! `flotilla enwrich-member`: one ENWRICH job member driven line by line from stdin (used by
//! the tests to run a job of real processes, and handy to try the protocol by hand).
//!
//! Commands, one per line; each prints one answer line (`error=MESSAGE` on failure):
//! - `open PATH CACHE_BYTES DIRECTORY_FRACTION FLUSH_TIMEOUT_MS` → `member=N` (the job's
//!   name and size come from `FLOTILLA_JOB_NAME` / `FLOTILLA_JOB_SIZE` or the launcher)
//! - `write OFFSET LENGTH SEED` → `stamp=T` (the bytes are `flotilla_cli` test bytes of SEED)
//! - `sync` → `ok`; `flushes` → `flushes=N`; `failure` → `failure=MESSAGE` (the last failed
//!   flush, empty if none); `close` → `ok`
//! - `read OFFSET LENGTH` → `sum=S` (reopens the file for reading: flush-on-read first)
//! - `quit`

use anyhow::{anyhow, Context};
use clap::Args;
use flotilla_client::{Client, EnwrichFile, EnwrichOptions};
use std::io::{BufRead, Write};

#[derive(Args)]
pub struct MemberArgs {
    #[command(flatten)]
    meta: crate::args::MetaArg,
}

/// The bytes a member writes for `(seed, length)` (the tests compute the same).
pub fn member_bytes(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

struct Member {
    client: Client,
    path: String,
    file: Option<EnwrichFile>,
}

pub fn member(args: MemberArgs) -> anyhow::Result<()> {
    let client = crate::keys::client(&args.meta.meta).context("connect to the metadata service")?;
    let mut member = Member { client, path: String::new(), file: None };
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let line = line?;
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"quit") {
            break;
        }
        let answer = member.command(&words).unwrap_or_else(|e| format!("error={e:#}").replace('\n', " "));
        let mut out = std::io::stdout().lock();
        writeln!(out, "{answer}")?;
        out.flush()?;
    }
    Ok(())
}

fn number<T: std::str::FromStr>(words: &[&str], index: usize) -> anyhow::Result<T> {
    let word = words.get(index).ok_or_else(|| anyhow!("argument {index} missing"))?;
    word.parse().map_err(|_| anyhow!("argument {index} ({word:?}) is not a number"))
}

impl Member {
    fn file(&self) -> anyhow::Result<&EnwrichFile> {
        self.file.as_ref().ok_or_else(|| anyhow!("no file open"))
    }

    fn command(&mut self, words: &[&str]) -> anyhow::Result<String> {
        match words.first().copied() {
            Some("open") => {
                let path = words.get(1).ok_or_else(|| anyhow!("open PATH ..."))?.to_string();
                let mut options = EnwrichOptions::from_env()
                    .ok_or_else(|| anyhow!("set FLOTILLA_JOB_NAME and FLOTILLA_JOB_SIZE"))?;
                options.cache_bytes = number(words, 2)?;
                options.directory_fraction = number(words, 3)?;
                options.flush_timeout_ms = number(words, 4)?;
                let file = self.client.open_enwrich(&path, &options)?;
                let answer = format!("member={}", file.member());
                (self.path, self.file) = (path, Some(file));
                Ok(answer)
            }
            Some("write") => {
                let (offset, length, seed): (u64, usize, u64) =
                    (number(words, 1)?, number(words, 2)?, number(words, 3)?);
                let stamp = self.file()?.write_at(offset, &member_bytes(seed, length))?;
                Ok(format!("stamp={stamp}"))
            }
            Some("sync") => self.file()?.sync().map(|()| "ok".to_string()).map_err(Into::into),
            Some("flushes") => Ok(format!("flushes={}", self.file()?.flushes())),
            Some("failure") => Ok(format!("failure={}", self.file()?.last_failure().unwrap_or_default())),
            Some("close") => {
                let file = self.file.take().ok_or_else(|| anyhow!("no file open"))?;
                file.close()?;
                Ok("ok".into())
            }
            Some("read") => {
                let (offset, length): (u64, usize) = (number(words, 1)?, number(words, 2)?);
                let file = self.client.open(&self.path)?;
                let mut buffer = vec![0u8; length];
                file.read_at(offset, &mut buffer)?;
                let sum = buffer.iter().fold(0u64, |s, b| s.wrapping_mul(31).wrapping_add(u64::from(*b)));
                Ok(format!("sum={sum}"))
            }
            other => Err(anyhow!("unknown command {other:?}")),
        }
    }
}
