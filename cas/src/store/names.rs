//! Image names: what is allowed, so that a name is always exactly one
//! directory under `images/` and never reaches outside it.

use crate::error::{Error, Result};

/// Longest image name, in bytes.
pub const IMAGE_NAME_BYTES_MAX: usize = 128;

/// Accepts 1..=128 bytes of UTF-8 without '/', NUL or other control
/// characters, without "..", and not starting with '.' (dot names are kept
/// for the store's own temporary entries; this also rules out "." and "..").
pub fn validate_image_name(name: &str) -> Result<()> {
    let bad = |why: &str| Err(Error::InvalidArgument(format!("image name {name:?} {why}")));
    if name.is_empty() {
        return bad("is empty");
    }
    if name.len() > IMAGE_NAME_BYTES_MAX {
        return bad(&format!("is longer than {IMAGE_NAME_BYTES_MAX} bytes"));
    }
    if name.starts_with('.') {
        return bad("starts with '.'");
    }
    if name.contains("..") {
        return bad("contains \"..\"");
    }
    if name.contains('/') {
        return bad("contains '/'");
    }
    if name.chars().any(char::is_control) {
        return bad("contains NUL or another control character");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["vm1", "disk-0.img", "a b", "ünïcode", &"x".repeat(128)] {
            validate_image_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in ["", ".", "..", "a/b", "/x", "a..b", "../x", ".hidden", "nul\0", "tab\t", &"x".repeat(129)]
        {
            assert!(validate_image_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
