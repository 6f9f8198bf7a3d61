//! Image names: the portable set a new image may take, and the looser rule
//! that still addresses an image made by an older casblk.
//!
//! A new name must be safe unquoted in a shell, as a udev symlink under
//! `/dev/casblk/` and as an object-store key: 1..=128 bytes of ASCII
//! letters, digits, `.`, `_`, `-` and `:`, not starting with `.` (kept for
//! the store's own temporary entries) or `-` (read as an option).
//!
//! Stores made before that rule may hold other names (spaces, non-ASCII).
//! Those images stay reachable, listed and counted by GC, under the old
//! rule: one path component, no NUL or control characters, no "..".

use crate::error::{Error, Result};

/// Longest image name, in bytes.
pub const IMAGE_NAME_BYTES_MAX: usize = 128;

/// The characters a new image name may use, as the error messages say it.
pub const IMAGE_NAME_CHARS: &str = "letters, digits, '.', '_', '-' and ':'";

fn portable(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':')
}

/// The rule for a name given to a new image (create, clone, import).
pub fn validate_image_name(name: &str) -> Result<()> {
    check_image_dir_name(name)?;
    let bad = |why: &str| Err(Error::InvalidArgument(format!("image name {name:?} {why}")));
    if let Some(c) = name.chars().find(|&c| !portable(c)) {
        return bad(&format!("contains {c:?}; a name may use only {IMAGE_NAME_CHARS}"));
    }
    if name.starts_with('-') {
        return bad("starts with '-'");
    }
    Ok(())
}

/// The rule for addressing an existing image: exactly one directory under
/// `images/`, never outside it. Accepts every name an older casblk could
/// create.
pub fn check_image_dir_name(name: &str) -> Result<()> {
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
    fn new_names_are_portable() {
        for ok in ["vm1", "disk-0.img", "tenant:vm_7", "A.b-c", &"x".repeat(128)] {
            validate_image_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in [
            "",
            ".",
            "..",
            "a/b",
            "/x",
            "a..b",
            "../x",
            ".hidden",
            "-rf",
            "nul\0",
            "tab\t",
            "a b",
            "a*",
            "a\\b",
            "ünïcode",
            "a$b",
            "a'b",
            "a\"b",
            "a;b",
            "a|b",
            &"x".repeat(129),
        ] {
            assert!(validate_image_name(bad).is_err(), "{bad:?} accepted");
        }
        let e = validate_image_name("a b").unwrap_err().to_string();
        assert!(e.contains("' '") && e.contains(IMAGE_NAME_CHARS), "{e}");
    }

    #[test]
    fn older_names_stay_addressable() {
        for ok in ["vm1", "a b", "ünïcode", "a*", "-x"] {
            check_image_dir_name(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
        }
        for bad in ["", ".", "..", "a/b", "a..b", ".hidden", "nul\0", &"x".repeat(129)] {
            assert!(check_image_dir_name(bad).is_err(), "{bad:?} accepted");
        }
    }
}
