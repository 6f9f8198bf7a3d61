//! What an `object_store` failure means to the engine, and a short
//! description of it for one-line messages.
//!
//! `object_store` maps HTTP statuses onto its error variants (404 NotFound,
//! 403 PermissionDenied, 401 Unauthenticated, 409 AlreadyExists, 412
//! Precondition); everything else, including failures to connect, is
//! `Generic` with the transport error somewhere in its source chain. A
//! missing bucket is a 404 whose S3 error code is `NoSuchBucket`.

use cas::objects::ObjectErrorKind;
use std::error::Error as _;

/// The kind of `e`.
pub(crate) fn kind(e: &object_store::Error) -> ObjectErrorKind {
    use object_store::Error as E;
    let text = chain(e);
    match e {
        E::NotFound { .. } if text.contains("NoSuchBucket") => ObjectErrorKind::NoBucket,
        E::NotFound { .. } => ObjectErrorKind::NotFound,
        E::PermissionDenied { .. } | E::Unauthenticated { .. } => ObjectErrorKind::Denied,
        E::AlreadyExists { .. } | E::Precondition { .. } => ObjectErrorKind::Exists,
        _ if text.contains("NoSuchBucket") => ObjectErrorKind::NoBucket,
        _ if text.contains("AccessDenied")
            || text.contains("InvalidAccessKeyId")
            || text.contains("SignatureDoesNotMatch")
            || text.contains("Forbidden") =>
        {
            ObjectErrorKind::Denied
        }
        _ if is_transport(e) => ObjectErrorKind::Unreachable,
        _ => ObjectErrorKind::Other,
    }
}

/// A short description: what went wrong, without the request dump.
pub(crate) fn summary(e: &object_store::Error) -> String {
    match kind(e) {
        ObjectErrorKind::NoBucket => "the bucket does not exist".into(),
        ObjectErrorKind::Denied => format!("access denied: check the key id and secret ({})", s3_code(e)),
        ObjectErrorKind::NotFound => "no such key".into(),
        ObjectErrorKind::Exists => "the key already exists".into(),
        ObjectErrorKind::Unreachable => format!("cannot connect ({})", innermost(e)),
        _ => innermost(e),
    }
}

/// The S3 error code in the reply body (`<Code>...</Code>`), if any.
fn s3_code(e: &object_store::Error) -> String {
    let text = chain(e);
    text.split("<Code>")
        .nth(1)
        .and_then(|rest| rest.split("</Code>").next())
        .map(str::to_string)
        .unwrap_or_else(|| "no S3 error code".into())
}

/// Every message in the source chain, joined.
fn chain(e: &object_store::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

/// The deepest error's message (the OS's or the server's own words),
/// on one line.
fn innermost(e: &object_store::Error) -> String {
    let mut last: &dyn std::error::Error = e;
    while let Some(s) = last.source() {
        last = s;
    }
    last.to_string().replace('\n', " ")
}

/// True when no HTTP reply came: connecting, sending or reading failed
/// (an `io::Error` or a timeout somewhere in the chain).
fn is_transport(e: &object_store::Error) -> bool {
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind as K;
            if matches!(
                io.kind(),
                K::ConnectionRefused
                    | K::ConnectionReset
                    | K::ConnectionAborted
                    | K::NotConnected
                    | K::TimedOut
                    | K::BrokenPipe
                    | K::UnexpectedEof
                    | K::HostUnreachable
                    | K::NetworkUnreachable
                    | K::AddrNotAvailable
            ) {
                return true;
            }
        }
        source = s.source();
    }
    let text = chain(e).to_ascii_lowercase();
    ["error sending request", "connection refused", "timed out", "connection closed", "dns error"]
        .iter()
        .any(|m| text.contains(m))
}
