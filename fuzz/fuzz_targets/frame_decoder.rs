//! Feeds arbitrary bytes to the frame decoder and the message decoders: none may panic,
//! and a shape that decodes must validate without panicking.
#![no_main]

use flotilla_proto::{decode_body, decode_frame, IoRequest, MetaRequest};
use flotilla_request::ShapeLimits;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = decode_frame(data, 1 << 20);
    if let Ok(request) = decode_body::<IoRequest>(data, "I/O request") {
        if let IoRequest::Read { shape, .. } | IoRequest::Write { shape, .. } = request {
            let _ = shape.validate(&ShapeLimits { pieces_max: 1 << 12, bytes_max: 1 << 20 });
        }
    }
    let _ = decode_body::<MetaRequest>(data, "metadata request");
});
