//! The decoders never panic on arbitrary bytes (the fuzz target in `fuzz/` runs the same
//! code under libFuzzer; this runs a quick random pass in every test run).

use flotilla_proto::{decode_body, decode_frame, FrameHeader, IoRequest, MetaRequest};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = decode_frame(&bytes, 1 << 20);
        let _ = decode_body::<IoRequest>(&bytes, "I/O request");
        let _ = decode_body::<MetaRequest>(&bytes, "metadata request");
    }

    #[test]
    fn valid_header_with_random_body_decodes_or_errs(body in prop::collection::vec(any::<u8>(), 0..300)) {
        let header = FrameHeader::for_payload(9, &body, b"").unwrap();
        let mut frame = header.encode().to_vec();
        frame.extend_from_slice(&body);
        let (decoded, used) = decode_frame(&frame, 1 << 20).unwrap();
        prop_assert_eq!(used, frame.len());
        prop_assert_eq!(&decoded.body[..], &body[..]);
        let _ = decode_body::<IoRequest>(&decoded.body, "I/O request");
    }
}
