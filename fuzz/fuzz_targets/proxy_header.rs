#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_proto::fuzzing::proxy_header(data));
