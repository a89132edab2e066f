//! Replies read straight into caller memory (`Connection::call_into`), against a model of
//! where each byte belongs, under every integrity level; corrupted and short replies are
//! refused or left in the frame, never placed as if good.

use bytes::Bytes;
use flotilla_auth::wire::Sealer;
use flotilla_auth::{
    Acceptor, AuthBounds, ClientAuth, ClusterCa, Credential, Integrity, IssueRequest, Limits, Opener, Role,
};
use flotilla_proto::{encode_body, read_frame_opened, FrameHeader, PayloadOpener, HEADER_BYTES};
use flotilla_rpc::{Connection, ConnectionConfig, ReplyData, RpcError, ScatterTarget, Segment};
use std::ptr::NonNull;
use std::sync::Arc;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

/// How the fake server answers: good data, one data byte flipped, one byte short, or good
/// data with a pause of [`PAUSE_MS`] half way through the data.
#[derive(Clone, Copy, serde::Serialize, serde::Deserialize, PartialEq, Eq, Debug)]
enum Answer {
    Good,
    Corrupt,
    Short,
    Paused,
}

const PAUSE_MS: u64 = 400;

/// The request: how to answer, and how many data bytes.
type Ask = (Answer, u32);

/// Byte `i` of every reply's data.
fn pattern(i: usize) -> u8 {
    (i.wrapping_mul(7919) >> 3) as u8 ^ (i as u8)
}

fn issue(ca: &ClusterCa, role: Role, name: &str) -> Arc<Credential> {
    let request =
        IssueRequest { role, name: name.into(), limits: Limits::default(), expires_unix_secs: None };
    Arc::new(ca.issue(request).unwrap())
}

/// A connection security: no handshake at all (CRC32C frames), or one at `integrity`.
#[derive(Clone, Copy, Debug)]
enum Mode {
    Crc,
    Auth(Integrity),
}

const MODES: [Mode; 4] =
    [Mode::Crc, Mode::Auth(Integrity::None), Mode::Auth(Integrity::Mac), Mode::Auth(Integrity::Encrypt)];

/// Starts a server answering every request of one connection as it asks; returns the
/// client's connection to it.
async fn connect(mode: Mode) -> Connection {
    connect_with(mode, ConnectionConfig::default()).await
}

async fn connect_with(mode: Mode, config: ConnectionConfig) -> Connection {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let ca = ClusterCa::generate();
    let bounds = |integrity| AuthBounds { integrity, ..AuthBounds::default() };
    let (server_credential, client_credential) =
        (issue(&ca, Role::Server, "s"), issue(&ca, Role::Client, "c"));
    let acceptor = match mode {
        Mode::Crc => None,
        Mode::Auth(integrity) => {
            Some(Acceptor::new(server_credential, vec![Role::Client], bounds(integrity)))
        }
    };
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let secured = match &acceptor {
            Some(acceptor) => Some(acceptor.accept(&mut stream, None).await.unwrap()),
            None => None,
        };
        let (sealer, opener) = match secured {
            Some(secured) => (Some(secured.sealer), Some(secured.opener)),
            None => (None, None),
        };
        answer_all(stream, sealer, opener).await;
    });
    let auth = match mode {
        Mode::Crc => None,
        Mode::Auth(integrity) => {
            Some(ClientAuth { credential: client_credential, bounds: bounds(integrity) })
        }
    };
    Connection::connect(&addr, ConnectionConfig { auth, ..config }).await.unwrap()
}

async fn answer_all(mut stream: TcpStream, mut sealer: Option<Sealer>, mut opener: Option<Opener>) {
    let mut buffer = bytes::BytesMut::new();
    loop {
        let decrypt = opener.as_mut().map(|o| o as &mut dyn PayloadOpener);
        let Ok(frame) = read_frame_opened(&mut stream, &mut buffer, 64 << 20, decrypt).await else { return };
        if let Some(opener) = opener.as_mut() {
            opener.check(&mut stream, &frame).await.unwrap();
        }
        let (answer, bytes): Ask = flotilla_proto::decode_body(&frame.body, "ask").unwrap();
        let data_bytes = if answer == Answer::Short { bytes as usize - 1 } else { bytes as usize };
        let data: Vec<u8> = (0..data_bytes).map(pattern).collect();
        let body = encode_body(&"data".to_string()).unwrap();
        let mut wire = match sealer.as_mut() {
            Some(sealer) => sealer.seal_frame(frame.request_id, &body, &data).unwrap(),
            None => {
                let mut wire =
                    FrameHeader::for_payload(frame.request_id, &body, &data).unwrap().encode().to_vec();
                wire.extend_from_slice(&body);
                wire.extend_from_slice(&data);
                wire
            }
        };
        if answer == Answer::Corrupt {
            wire[HEADER_BYTES + body.len() + data_bytes / 2] ^= 0x10;
        }
        let half = HEADER_BYTES + body.len() + data_bytes / 2;
        if answer == Answer::Paused {
            let _ = stream.write_all(&wire[..half]).await;
            tokio::time::sleep(std::time::Duration::from_millis(PAUSE_MS)).await;
        }
        let start = if answer == Answer::Paused { half } else { 0 };
        if stream.write_all(&wire[start..]).await.is_err() {
            return;
        }
    }
}

/// What the memory must hold after a good reply: the data, packed, at each segment.
fn model(segments: &[Segment], memory_bytes: usize) -> Vec<u8> {
    let mut memory = vec![0u8; memory_bytes];
    let mut at = 0;
    for segment in segments {
        for (i, byte) in memory[segment.offset..][..segment.length].iter_mut().enumerate() {
            *byte = pattern(at + i);
        }
        at += segment.length;
    }
    memory
}

/// Calls with `answer` into fresh zeroed memory over `segments`; the memory afterwards.
async fn call(
    connection: &Connection,
    answer: Answer,
    segments: &[Segment],
    memory_bytes: usize,
) -> (Result<ReplyData, RpcError>, Vec<u8>) {
    let mut memory = vec![0u8; memory_bytes];
    let base = NonNull::new(memory.as_mut_ptr()).unwrap();
    // SAFETY: `memory` outlives the target (dropped at the end of this block, or inside the
    // failed call) and is not touched until then.
    let target = unsafe { ScatterTarget::new(base, memory_bytes, segments.iter().copied()) }.unwrap();
    let bytes = target.data_bytes() as u32;
    let outcome = connection.call_into::<Ask, String>(&(answer, bytes), Bytes::new(), target).await;
    let outcome = outcome.map(|(reply, data, target)| {
        assert_eq!(reply, "data");
        drop(target);
        data
    });
    (outcome, memory)
}

fn strided(count: usize, record_bytes: usize, stride_bytes: usize) -> Vec<Segment> {
    (0..count).map(|i| Segment { offset: 3 + i * stride_bytes, length: record_bytes }).collect()
}

/// Uneven pieces of at least `length_min` bytes in descending memory order, some adjacent.
fn list(length_min: usize) -> Vec<Segment> {
    let mut offset = 0;
    let mut segments: Vec<Segment> = (0..200)
        .map(|i| {
            let segment = Segment { offset, length: length_min + (i * 37) % 301 };
            offset += segment.length + (i % 3) * 5;
            segment
        })
        .collect();
    segments.reverse();
    segments
}

/// Shapes read straight into memory (long segments) and copied there (short ones).
#[tokio::test]
async fn good_replies_land_where_the_model_says_under_every_mode() {
    let shapes: [(Vec<Segment>, usize); 5] = [
        (strided(1000, 13, 29), 29_003),
        (strided(100, 5000, 9001), 900_103),
        (list(1), 40_000),
        (list(4096), 1 << 20),
        (vec![Segment { offset: 5 << 20, length: 3 << 20 }, Segment { offset: 0, length: 5 << 20 }], 8 << 20),
    ];
    for mode in MODES {
        let connection = connect(mode).await;
        for (segments, memory_bytes) in &shapes {
            let (outcome, memory) = call(&connection, Answer::Good, segments, *memory_bytes).await;
            let bytes: u64 = segments.iter().map(|s| s.length as u64).sum();
            assert!(
                matches!(outcome, Ok(ReplyData::Placed { bytes: b }) if b == bytes),
                "{mode:?}: {outcome:?}"
            );
            assert!(memory == model(segments, *memory_bytes), "{mode:?}: bytes misplaced");
        }
    }
}

#[tokio::test]
async fn a_short_reply_is_left_in_the_frame_and_places_nothing() {
    for mode in MODES {
        let connection = connect(mode).await;
        let segments = strided(100, 10, 20);
        let (outcome, memory) = call(&connection, Answer::Short, &segments, 2003).await;
        assert!(matches!(&outcome, Ok(ReplyData::Other(data)) if data.len() == 999), "{mode:?}: {outcome:?}");
        assert!(memory.iter().all(|b| *b == 0), "{mode:?}: a short reply wrote caller memory");
        // The connection is still good.
        let (outcome, memory) = call(&connection, Answer::Good, &segments, 2003).await;
        assert!(matches!(outcome, Ok(ReplyData::Placed { bytes: 1000 })), "{mode:?}: {outcome:?}");
        assert!(memory == model(&segments, 2003));
    }
}

#[tokio::test]
async fn a_corrupted_reply_fails_the_call() {
    for mode in MODES {
        let shapes =
            [strided(1000, 13, 29), strided(100, 5000, 9001), vec![Segment { offset: 0, length: 2 << 20 }]];
        for segments in shapes {
            let connection = connect(mode).await;
            let memory_bytes = segments.last().map(|s| s.offset + s.length).unwrap();
            let (outcome, _) = call(&connection, Answer::Corrupt, &segments, memory_bytes).await;
            assert!(matches!(outcome, Err(RpcError::ConnectionLost { .. })), "{mode:?}: {outcome:?}");
            assert!(connection.is_broken(), "{mode:?}: the connection outlived a bad frame");
        }
    }
}

#[tokio::test]
async fn a_call_that_ends_mid_reply_gets_no_more_bytes_and_the_connection_goes_on() {
    for mode in MODES {
        let config = ConnectionConfig { call_timeout_ms: PAUSE_MS / 2, ..ConnectionConfig::default() };
        let connection = connect_with(mode, config).await;
        let segments = [Segment { offset: 0, length: 1 << 20 }];
        let (outcome, memory) = call(&connection, Answer::Paused, &segments, 1 << 20).await;
        assert!(matches!(outcome, Err(RpcError::CallTimeout { .. })), "{mode:?}: {outcome:?}");
        // The rest of the reply arrives after the call gave its target back: read past, checked.
        tokio::time::sleep(std::time::Duration::from_millis(PAUSE_MS)).await;
        assert!(memory[(1 << 19) + 64..].iter().all(|b| *b == 0), "{mode:?}: written after the call ended");
        let (outcome, memory) = call(&connection, Answer::Good, &segments, 1 << 20).await;
        assert!(matches!(outcome, Ok(ReplyData::Placed { .. })), "{mode:?}: {outcome:?}");
        assert!(memory == model(&segments, 1 << 20), "{mode:?}");
    }
}
