use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use flotilla_auth::{initiate, respond, AuthError, ClusterCa, Credential, IssueRequest, Limits, Role};
use proptest::prelude::*;

const TIMEOUT: Duration = Duration::from_secs(5);

fn issue(ca: &ClusterCa, role: Role, name: &str) -> Credential {
    let request =
        IssueRequest { role, name: name.into(), limits: Limits::default(), expires_unix_secs: None };
    ca.issue(request).expect("issue")
}

#[test]
fn credential_round_trips_with_mode_0600() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate();
    let limits = Limits {
        read_only: true,
        subtree: Some("/home/a".into()),
        uid: Some(7),
        gid: Some(8),
        root_squash: true,
    };
    let request = IssueRequest {
        role: Role::Client,
        name: "alice".into(),
        limits: limits.clone(),
        expires_unix_secs: None,
    };
    let cred = ca.issue(request).unwrap();
    let path = dir.path().join("client.cred");
    cred.save(&path).unwrap();
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let loaded = Credential::load(&path).unwrap();
    assert_eq!(loaded.certificate().name, "alice");
    assert_eq!(loaded.certificate().limits, limits);
    assert_eq!(loaded.certificate().role, Role::Client);
    assert!(loaded.capability_key().is_none(), "clients never get the capability key");
}

#[test]
fn server_credentials_share_the_ca_capability_key() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate();
    ca.save(&dir.path().join("cluster.key")).unwrap();
    let ca = ClusterCa::load(&dir.path().join("cluster.key")).unwrap();
    let a = issue(&ca, Role::Server, "a");
    let b = issue(&ca, Role::Server, "b");
    assert!(a.capability_key().is_some());
    assert_eq!(a.capability_key(), b.capability_key());
}

#[test]
fn server_credentials_refuse_limits() {
    let ca = ClusterCa::generate();
    let limits = Limits { read_only: true, ..Limits::default() };
    let request = IssueRequest { role: Role::Server, name: "s".into(), limits, expires_unix_secs: None };
    assert!(matches!(ca.issue(request), Err(AuthError::BadRequest(_))));
}

#[test]
fn load_names_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let missing = Credential::load(&dir.path().join("none")).err().unwrap().to_string();
    assert!(missing.contains("none"), "{missing}");
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"hello world, not a key").unwrap();
    let message = Credential::load(&junk).err().unwrap().to_string();
    assert!(message.contains("wrong magic"), "{message}");
    let ca = ClusterCa::generate();
    ca.save(&junk).unwrap();
    let message = Credential::load(&junk).err().unwrap().to_string();
    assert!(message.contains("not a Flotilla credential"), "{message}");
}

#[test]
fn tampered_credential_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate();
    let path = dir.path().join("c");
    issue(&ca, Role::Client, "mallory").save(&path).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    // Turn the role byte or the name into something else: any change in the body breaks the signature.
    let at = bytes.windows(7).position(|w| w == b"mallory").unwrap();
    bytes[at] = b'M';
    std::fs::write(&path, &bytes).unwrap();
    let message = Credential::load(&path).err().unwrap().to_string();
    assert!(message.contains("not signed"), "{message}");
}

#[test]
fn expired_credential_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ClusterCa::generate();
    let request = IssueRequest {
        role: Role::Client,
        name: "old".into(),
        limits: Limits::default(),
        expires_unix_secs: Some(1),
    };
    let path = dir.path().join("c");
    ca.issue(request).unwrap().save(&path).unwrap();
    let message = Credential::load(&path).err().unwrap().to_string();
    assert!(message.contains("expired"), "{message}");
}

async fn run(
    client: &Credential,
    server: &Credential,
    allowed: &[Role],
) -> (Result<flotilla_auth::Established, AuthError>, Result<flotilla_auth::Established, AuthError>) {
    let (mut a, mut b) = tokio::io::duplex(16 * 1024);
    let (c, s) = tokio::join!(
        async {
            let r = initiate(&mut a, client, TIMEOUT).await;
            drop(a);
            r
        },
        async {
            let r = respond(&mut b, server, allowed, TIMEOUT).await;
            drop(b);
            r
        }
    );
    (c, s)
}

#[tokio::test]
async fn handshake_authenticates_both_sides_and_keys_match() {
    let ca = ClusterCa::generate();
    let client = issue(&ca, Role::Client, "alice");
    let server = issue(&ca, Role::Server, "meta");
    let (c, s) = run(&client, &server, &[Role::Client, Role::Server]).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    assert_eq!(c.peer.name, "meta");
    assert_eq!(c.peer.role, Role::Server);
    assert_eq!(s.peer.name, "alice");
    assert_eq!(s.peer.role, Role::Client);
    let tag = c.keys.seal.seal(1, b"body", b"data");
    s.keys.open.open(1, b"body", b"data", &tag).unwrap();
    let tag = s.keys.seal.seal(1, b"reply", b"");
    c.keys.open.open(1, b"reply", b"", &tag).unwrap();
}

#[tokio::test]
async fn other_cluster_is_refused() {
    let ours = ClusterCa::generate();
    let theirs = ClusterCa::generate();
    let client = issue(&theirs, Role::Client, "intruder");
    let server = issue(&ours, Role::Server, "meta");
    let (c, s) = run(&client, &server, &[Role::Client]).await;
    assert!(matches!(c, Err(AuthError::BadSignature)), "client sees the server is not of its cluster");
    assert!(s.is_err());
}

#[tokio::test]
async fn client_posing_as_server_is_refused_by_the_initiator() {
    let ca = ClusterCa::generate();
    let client = issue(&ca, Role::Client, "alice");
    let fake_server = issue(&ca, Role::Client, "bob");
    let (c, _) = run(&client, &fake_server, &[Role::Client]).await;
    assert!(matches!(c, Err(AuthError::WrongRole { role: Role::Client, .. })), "{:?}", c.err());
}

#[tokio::test]
async fn responder_refuses_roles_not_allowed() {
    let ca = ClusterCa::generate();
    let client = issue(&ca, Role::Client, "alice");
    let server = issue(&ca, Role::Server, "meta");
    let (_, s) = run(&client, &server, &[Role::Server]).await;
    assert!(matches!(s, Err(AuthError::WrongRole { role: Role::Client, .. })));
}

#[tokio::test]
async fn replayed_handshake_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = ClusterCa::generate();
    let client = issue(&ca, Role::Client, "alice");
    let server = issue(&ca, Role::Server, "meta");
    // Record everything the client sends in a genuine handshake.
    let (mut a, b) = tokio::io::duplex(16 * 1024);
    let (mut tap_server, tap_client) = tokio::io::duplex(16 * 1024);
    let (mut br, mut bw) = tokio::io::split(b);
    let (mut tr, mut tw) = tokio::io::split(tap_client);
    let (c, s, recorded, _) = tokio::join!(
        async {
            let r = initiate(&mut a, &client, TIMEOUT).await;
            drop(a);
            r
        },
        async {
            let r = respond(&mut tap_server, &server, &[Role::Client], TIMEOUT).await;
            drop(tap_server);
            r
        },
        async {
            let mut recorded = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                let n = br.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                recorded.extend_from_slice(&buf[..n]);
                tw.write_all(&buf[..n]).await.unwrap();
            }
            drop(tw);
            recorded
        },
        async {
            let _ = tokio::io::copy(&mut tr, &mut bw).await;
            drop(bw);
        }
    );
    c.unwrap();
    s.unwrap();
    // Replay the recorded bytes to a fresh responder: it picks a new ephemeral key, so the
    // third message cannot be decrypted.
    let (mut x, mut y) = tokio::io::duplex(16 * 1024);
    let (sent, replayed) = tokio::join!(
        async {
            x.write_all(&recorded).await.unwrap();
            let mut sink = vec![0u8; 4096];
            let _ = x.read(&mut sink).await;
            drop(x);
        },
        respond(&mut y, &server, &[Role::Client], TIMEOUT)
    );
    let () = sent;
    assert!(replayed.is_err(), "a replayed handshake must not authenticate");
}

#[tokio::test]
async fn altered_reordered_and_replayed_frames_fail_the_tag() {
    let ca = ClusterCa::generate();
    let (c, s) = run(&issue(&ca, Role::Client, "a"), &issue(&ca, Role::Server, "m"), &[Role::Client]).await;
    let (mut c, mut s) = (c.unwrap(), s.unwrap());
    let first = c.keys.seal.seal(1, b"one", b"");
    let second = c.keys.seal.seal(2, b"two", b"");
    assert!(matches!(s.keys.open.open(2, b"two", b"", &second), Err(AuthError::BadTag { .. })), "reordered");
    assert!(s.keys.open.open(1, b"onE", b"", &first).is_err(), "altered body");
    assert!(s.keys.open.open(7, b"one", b"", &first).is_err(), "altered request id");
    s.keys.open.open(1, b"one", b"", &first).unwrap();
    assert!(s.keys.open.open(1, b"one", b"", &first).is_err(), "replayed");
    s.keys.open.open(2, b"two", b"", &second).unwrap();
    // A tag for one direction is not valid in the other.
    let echo = c.keys.seal.seal(3, b"x", b"");
    assert!(c.keys.open.open(3, b"x", b"", &echo).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn any_flipped_bit_fails_the_tag(body in proptest::collection::vec(any::<u8>(), 1..256), data in proptest::collection::vec(any::<u8>(), 0..256), bit in any::<usize>()) {
        let hash = [9u8; 32];
        let mut sender = flotilla_auth::TagKeys::from_handshake_hash(&hash, true);
        let mut receiver = flotilla_auth::TagKeys::from_handshake_hash(&hash, false);
        let tag = sender.seal.seal(5, &body, &data);
        let mut payload: Vec<u8> = body.iter().chain(data.iter()).copied().collect();
        let at = bit % (payload.len() * 8);
        payload[at / 8] ^= 1 << (at % 8);
        let (b, d) = payload.split_at(body.len());
        prop_assert!(receiver.open.open(5, b, d, &tag).is_err());
        prop_assert!(receiver.open.open(5, &body, &data, &tag).is_ok());
    }
}

/// Both ends of a connection after the handshake, as the services and rpc use them.
async fn secured_pair(
    client_integrity: flotilla_auth::Integrity,
    server_integrity: flotilla_auth::Integrity,
) -> (tokio::io::DuplexStream, flotilla_auth::Secured, tokio::io::DuplexStream, flotilla_auth::Secured) {
    use flotilla_auth::{Acceptor, AuthBounds, ClientAuth};
    use std::sync::Arc;
    let ca = ClusterCa::generate();
    let client = Arc::new(issue(&ca, Role::Client, "alice"));
    let server = Arc::new(issue(&ca, Role::Server, "io"));
    let bounds = |integrity| AuthBounds { integrity, ..AuthBounds::default() };
    let auth = ClientAuth { credential: client, bounds: bounds(client_integrity) };
    let acceptor = Acceptor::new(server, vec![Role::Client], bounds(server_integrity));
    let (mut a, mut b) = tokio::io::duplex(64 * 1024);
    let (c, s) = tokio::join!(auth.connect(&mut a), acceptor.accept(&mut b, None));
    assert_eq!(acceptor.failures(), 0);
    (a, c.unwrap(), b, s.expect("accepted"))
}

#[tokio::test]
async fn sealed_frames_pass_and_tampered_or_untagged_frames_are_refused() {
    use flotilla_auth::Integrity;
    use tokio::io::AsyncWriteExt;
    let (mut a, mut client, mut b, mut server) = secured_pair(Integrity::Mac, Integrity::Mac).await;
    assert_eq!(server.peer.name, "alice");
    let mut buffer = bytes::BytesMut::new();
    for request_id in 1..4u64 {
        client.sealer.write_frame(&mut a, request_id, b"body", b"data").await.unwrap();
        let frame = flotilla_proto::read_frame(&mut b, &mut buffer, 1 << 20).await.unwrap();
        server.opener.check(&mut b, &frame).await.unwrap();
        assert_eq!((frame.request_id, &frame.data[..]), (request_id, &b"data"[..]));
    }
    // One altered byte in the data: the tag fails.
    let mut bytes = client.sealer.seal_frame(9, b"body", b"data").unwrap();
    let at = bytes.len() - flotilla_auth::TAG_BYTES - 1;
    bytes[at] ^= 1;
    // A tagged frame carries no payload CRC32C: the keyed tag is what notices.
    assert_eq!(
        flotilla_proto::FrameHeader::decode(&bytes[..32].try_into().unwrap(), 1 << 20)
            .unwrap()
            .payload_crc32c,
        0
    );
    a.write_all(&bytes).await.unwrap();
    let frame = flotilla_proto::read_frame(&mut b, &mut buffer, 1 << 20).await.unwrap();
    let error = server.opener.check(&mut b, &frame).await.unwrap_err();
    assert!(error.to_string().contains("integrity tag mismatch"), "{error}");
    // An untagged frame where tags are required.
    flotilla_proto::write_frame(&mut a, 10, b"x", b"").await.unwrap();
    let frame = flotilla_proto::read_frame(&mut b, &mut buffer, 1 << 20).await.unwrap();
    let error = server.opener.check(&mut b, &frame).await.unwrap_err();
    assert!(error.to_string().contains("no integrity tag"), "{error}");
}

#[tokio::test]
async fn integrity_none_sends_untagged_frames_which_a_mac_side_refuses() {
    use flotilla_auth::Integrity;
    let (mut a, mut client, mut b, mut server) = secured_pair(Integrity::None, Integrity::None).await;
    let mut buffer = bytes::BytesMut::new();
    client.sealer.write_frame(&mut a, 1, b"body", b"").await.unwrap();
    let frame = flotilla_proto::read_frame(&mut b, &mut buffer, 1 << 20).await.unwrap();
    assert_eq!(frame.flags & flotilla_proto::FLAG_TAGGED, 0);
    server.opener.check(&mut b, &frame).await.unwrap();
    // A side asking for none is raised to mac by a mac peer (the stronger wins) ...
    let (mut a, client, mut b, mut server) = secured_pair(Integrity::None, Integrity::Mac).await;
    assert_eq!((client.sealer.integrity(), client.opener.integrity()), (Integrity::Mac, Integrity::Mac));
    // ... and an untagged frame sent anyway is refused.
    flotilla_proto::write_frame(&mut a, 1, b"body", b"").await.unwrap();
    let frame = flotilla_proto::read_frame(&mut b, &mut buffer, 1 << 20).await.unwrap();
    assert!(server.opener.check(&mut b, &frame).await.is_err(), "a mac side took an untagged frame");
}

/// Reads one frame as the services and rpc do: decrypted by `opener` as it is read, then
/// checked.
async fn read_checked<R: tokio::io::AsyncRead + Unpin>(
    reader: &mut R,
    buffer: &mut bytes::BytesMut,
    opener: &mut flotilla_auth::Opener,
) -> Result<flotilla_proto::Frame, flotilla_proto::FrameError> {
    let frame = flotilla_proto::read_frame_opened(reader, buffer, 1 << 24, Some(opener)).await?;
    opener.check(reader, &frame).await.map(|()| frame)
}

/// A distinctive 64 KiB pattern.
fn pattern() -> Vec<u8> {
    (0..64 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test]
async fn encrypted_frames_round_trip_both_ways_and_the_wire_carries_no_plaintext() {
    use flotilla_auth::Integrity;
    let (_a, mut client, _b, mut server) = secured_pair(Integrity::Encrypt, Integrity::Encrypt).await;
    let data = pattern();
    let mut wire = Vec::new();
    for request_id in 1..4u64 {
        client.sealer.write_frame(&mut wire, request_id, b"a body", &data).await.unwrap();
    }
    assert!(!contains(&wire, &data[..256]), "plaintext data on the wire");
    assert!(!contains(&wire, b"a body"), "plaintext body on the wire");
    let (mut reader, mut buffer) = (&wire[..], bytes::BytesMut::new());
    for request_id in 1..4u64 {
        let frame = read_checked(&mut reader, &mut buffer, &mut server.opener).await.unwrap();
        assert_eq!(frame.flags, flotilla_proto::FLAG_ENCRYPTED);
        assert_eq!((frame.request_id, &frame.body[..]), (request_id, &b"a body"[..]));
        assert!(frame.data == data, "data of request {request_id} differs after decryption");
    }
    // The reply direction, with an empty data part.
    let mut reply = Vec::new();
    server.sealer.write_frame(&mut reply, 3, b"reply", b"").await.unwrap();
    let frame = read_checked(&mut &reply[..], &mut buffer, &mut client.opener).await.unwrap();
    assert_eq!((&frame.body[..], frame.data.len()), (&b"reply"[..], 0));
    // With mac, the same data is visible on the wire (the check above can fail).
    let (_a, mut client, _b, _server) = secured_pair(Integrity::Mac, Integrity::Mac).await;
    let mut wire = Vec::new();
    client.sealer.write_frame(&mut wire, 1, b"a body", &data).await.unwrap();
    assert!(contains(&wire, &data[..256]));
}

#[tokio::test]
async fn the_stronger_setting_wins_on_both_sides() {
    use flotilla_auth::Integrity::{Encrypt, Mac, None};
    for (asked_by_client, asked_by_server) in
        [(None, Mac), (Mac, Encrypt), (Encrypt, Mac), (None, Encrypt), (None, None)]
    {
        let (_a, client, _b, server) = secured_pair(asked_by_client, asked_by_server).await;
        let agreed = asked_by_client.max(asked_by_server);
        for (side, sealer, opener) in
            [("client", &client.sealer, &client.opener), ("server", &server.sealer, &server.opener)]
        {
            let levels = (sealer.integrity(), opener.integrity());
            assert_eq!(levels, (agreed, agreed), "{side} of {asked_by_client} / {asked_by_server}");
        }
    }
}

#[tokio::test]
async fn an_encrypting_side_refuses_plain_tagged_and_altered_frames() {
    use flotilla_auth::Integrity;
    let (_a, mut client, _b, mut server) = secured_pair(Integrity::Mac, Integrity::Encrypt).await;
    let mut buffer = bytes::BytesMut::new();
    // A plain frame, and a frame carrying a mac tag.
    let mut plain = Vec::new();
    flotilla_proto::write_frame(&mut plain, 1, b"x", b"").await.unwrap();
    let error = read_checked(&mut &plain[..], &mut buffer, &mut server.opener).await.unwrap_err();
    assert!(error.to_string().contains("requires integrity = encrypt"), "{error}");
    let mut tagged = plain.clone();
    let header = flotilla_proto::FrameHeader {
        flags: flotilla_proto::FLAG_TAGGED,
        ..flotilla_proto::FrameHeader::for_payload(1, b"x", b"").unwrap()
    };
    tagged[..32].copy_from_slice(&header.encode());
    tagged.extend_from_slice(&[0u8; flotilla_auth::TAG_BYTES]);
    let error = read_checked(&mut &tagged[..], &mut buffer, &mut server.opener).await.unwrap_err();
    assert!(error.to_string().contains("requires integrity = encrypt"), "{error}");
    // An encrypted frame whose request id was changed (header checksum made to match).
    let mut sealed = client.sealer.seal_frame(5, b"body", b"data").unwrap();
    let mut header = flotilla_proto::FrameHeader::decode(sealed[..32].try_into().unwrap(), 1 << 20).unwrap();
    header.request_id = 6;
    sealed[..32].copy_from_slice(&header.encode());
    let error = read_checked(&mut &sealed[..], &mut buffer, &mut server.opener).await.unwrap_err();
    assert!(error.to_string().contains("does not decrypt"), "{error}");
    // The same frame unaltered still opens: the failure did not advance the sequence.
    let sealed = {
        let mut s = sealed.clone();
        header.request_id = 5;
        s[..32].copy_from_slice(&header.encode());
        s
    };
    read_checked(&mut &sealed[..], &mut buffer, &mut server.opener).await.unwrap();
    // Replayed: refused.
    let error = read_checked(&mut &sealed[..], &mut buffer, &mut server.opener).await.unwrap_err();
    assert!(error.to_string().contains("does not decrypt"), "{error}");
    // Its last byte (the AEAD tag) altered: refused.
    let mut next = client.sealer.seal_frame(7, b"body", b"data").unwrap();
    *next.last_mut().unwrap() ^= 1;
    let error = read_checked(&mut &next[..], &mut buffer, &mut server.opener).await.unwrap_err();
    assert!(error.to_string().contains("does not decrypt"), "{error}");
}

#[tokio::test]
async fn an_encrypted_frame_is_refused_where_nothing_decrypts_it() {
    use flotilla_auth::Integrity;
    let (_a, mut client, _b, mut server) = secured_pair(Integrity::Encrypt, Integrity::Encrypt).await;
    let sealed = client.sealer.seal_frame(1, b"body", b"data").unwrap();
    let mut buffer = bytes::BytesMut::new();
    // A reader without the opener refuses it ...
    let error = flotilla_proto::read_frame(&mut &sealed[..], &mut buffer, 1 << 20).await.unwrap_err();
    assert!(error.to_string().contains("without encryption keys"), "{error}");
    // ... and so does a mac side given one (the check without decryption).
    let (_a, _client, _b, mut mac_server) = secured_pair(Integrity::Mac, Integrity::Mac).await;
    let error = read_checked(&mut &sealed[..], &mut buffer, &mut mac_server.opener).await.unwrap_err();
    assert!(error.to_string().contains("agreed on integrity = mac"), "{error}");
    // An opener's check refuses a frame its reader did not decrypt.
    let frame = flotilla_proto::Frame {
        request_id: 1,
        flags: flotilla_proto::FLAG_ENCRYPTED,
        body: bytes::Bytes::from_static(b"body"),
        data: bytes::Bytes::new(),
    };
    let error = server.opener.check(&mut &[][..], &frame).await.unwrap_err();
    assert!(error.to_string().contains("not decrypted"), "{error}");
}

#[tokio::test]
async fn lowering_the_asked_level_in_transit_breaks_the_handshake() {
    use flotilla_auth::{initiate_with, respond_with, Integrity};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ca = ClusterCa::generate();
    let client = issue(&ca, Role::Client, "alice");
    let server = issue(&ca, Role::Server, "meta");
    let (mut a, b) = tokio::io::duplex(16 * 1024);
    let (mut to_server, server_end) = tokio::io::duplex(16 * 1024);
    let (mut b_read, mut b_write) = tokio::io::split(b);
    let (mut s_read, mut s_write) = tokio::io::split(server_end);
    let (c, s, (), ()) = tokio::join!(
        async {
            let r = initiate_with(&mut a, &client, Integrity::Encrypt, TIMEOUT).await;
            drop(a);
            r
        },
        async {
            // The server may only notice when its wait for message 3 ends: keep that short.
            let wait = Duration::from_millis(500);
            let r = respond_with(&mut to_server, &server, &[Role::Client], Integrity::Mac, wait).await;
            drop(to_server);
            r
        },
        async {
            // Message 1 is `length (2) | e (32) | level (1)`: rewrite encrypt as none.
            let mut first = [0u8; 35];
            b_read.read_exact(&mut first).await.unwrap();
            assert_eq!(first[34], Integrity::Encrypt.to_wire());
            first[34] = Integrity::None.to_wire();
            s_write.write_all(&first).await.unwrap();
            let _ = tokio::io::copy(&mut b_read, &mut s_write).await;
            drop(s_write);
        },
        async {
            let _ = tokio::io::copy(&mut s_read, &mut b_write).await;
            drop(b_write);
        }
    );
    assert!(c.is_err(), "the client completed a handshake whose first message was altered");
    assert!(s.is_err(), "the server completed a handshake whose first message was altered");
}
