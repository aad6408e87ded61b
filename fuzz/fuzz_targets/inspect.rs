//! The CLI's inspect decoder (`cxc inspect` and `cxc inspect --json`) on arbitrary bytes.
#![no_main]

use cxc_fuzz::write_input;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let path = write_input(data);
    let text = cxc_cli::inspect_file(path);
    let json = cxc_cli::inspect_file_json(path);
    // Both renderings decode the same file: they succeed or fail together.
    assert_eq!(text.is_ok(), json.is_ok(), "{text:?} vs {json:?}");
    if let Err(e) = &text {
        assert!(!e.contains('\n'), "multi-line error: {e:?}");
    }
});
