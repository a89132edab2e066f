//! One `flotilla enwrich-member` process, driven over its stdin and answering one line
//! per command (killed when dropped), and the bytes it writes: shared by the ENWRICH tests.

use super::{client_key, FLOTILLA};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// The bytes `flotilla enwrich-member` writes for `(seed, length)`.
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

pub struct Member {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    pub index: u32,
}

impl Member {
    pub fn start(meta: &str, job: &str, size: u32) -> Member {
        let mut child = Command::new(FLOTILLA)
            .args(["enwrich-member", "--meta", meta])
            .env("FLOTILLA_KEY", client_key())
            .env("FLOTILLA_JOB_NAME", job)
            .env("FLOTILLA_JOB_SIZE", size.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start a member");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Member { child, stdin, stdout, index: 0 }
    }

    pub fn send(&mut self, command: &str) {
        writeln!(self.stdin, "{command}").expect("send a command");
        self.stdin.flush().expect("flush stdin");
    }

    pub fn answer(&mut self) -> String {
        let mut line = String::new();
        self.stdout.read_line(&mut line).expect("read an answer");
        line.trim().to_string()
    }

    pub fn ask(&mut self, command: &str) -> String {
        self.send(command);
        self.answer()
    }

    pub fn value(&mut self, command: &str, key: &str) -> String {
        let answer = self.ask(command);
        match answer.strip_prefix(&format!("{key}=")) {
            Some(value) => value.to_string(),
            None => panic!("{command:?} answered {answer:?}"),
        }
    }

    pub fn open(&mut self, file: &str, cache_bytes: u64, fraction: f64, timeout_ms: u64) {
        self.index = self
            .value(&format!("open {file} {cache_bytes} {fraction} {timeout_ms}"), "member")
            .parse()
            .unwrap();
    }

    /// Writes and returns the write's stamp.
    pub fn write(&mut self, offset: u64, length: usize, seed: u64) -> u64 {
        self.value(&format!("write {offset} {length} {seed}"), "stamp").parse().unwrap()
    }

    pub fn flushes(&mut self) -> u64 {
        self.value("flushes", "flushes").parse().unwrap()
    }

    /// Waits (bounded) until this member took part in at least `count` flushes.
    pub fn wait_flushes(&mut self, count: u64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.flushes() < count {
            assert!(Instant::now() < deadline, "member {} never reached {count} flushes", self.index);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits (bounded) until this member's watcher recorded a failed flush; its message.
    pub fn wait_failure(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let failure = self.value("failure", "failure");
            if !failure.is_empty() {
                return failure;
            }
            assert!(Instant::now() < deadline, "member {} recorded no failed flush", self.index);
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id (to stop or continue the member with a signal).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.kill();
    }
}
