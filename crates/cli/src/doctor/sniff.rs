//! What a gRPC port speaks, found without trusting either guess: doctor
//! sends the HTTP/2 client preface in the clear and reads the first bytes.
//! A plaintext gRPC server answers with a SETTINGS frame; a TLS server
//! answers with a TLS alert or hangs up. That turns "transport error" into
//! "you dialled plaintext, the server wants TLS" (or the reverse).

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// The HTTP/2 connection preface followed by an empty SETTINGS frame.
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";

/// HTTP/2 frame type of SETTINGS (the 4th byte of a frame header).
const SETTINGS: u8 = 0x04;
/// TLS record types: alert and handshake.
const TLS_ALERT: u8 = 0x15;
const TLS_HANDSHAKE: u8 = 0x16;

/// What the port turned out to speak.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Wire {
    /// Nothing accepts connections there.
    Refused(String),
    /// Plaintext HTTP/2 (gRPC without TLS).
    PlainH2,
    /// TLS (it rejected the cleartext preface).
    Tls,
    /// Something else, or no answer in time.
    Unknown(String),
}

/// Probes `addr` (host:port). Blocking, bounded by `timeout` per step: a
/// handful of bytes on one connection.
pub(super) fn sniff(addr: &str, timeout: Duration) -> Wire {
    let target = match addr.to_socket_addrs().map(|mut a| a.next()) {
        Ok(Some(a)) => a,
        Ok(None) => return Wire::Refused(format!("{addr} resolves to no address")),
        Err(e) => return Wire::Refused(format!("cannot resolve {addr}: {e}")),
    };
    let mut conn = match TcpStream::connect_timeout(&target, timeout) {
        Ok(c) => c,
        Err(e) => return Wire::Refused(e.to_string()),
    };
    if let Err(e) = conn
        .set_read_timeout(Some(timeout))
        .and_then(|()| conn.write_all(PREFACE))
    {
        return Wire::Unknown(format!("write failed: {e}"));
    }
    let mut head = [0u8; 9];
    let mut got = 0;
    while got < 4 {
        match conn.read(&mut head[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Wire::Unknown(format!("no answer to HTTP/2 within {timeout:?}"));
            }
            // Reset: a TLS stack hanging up on the cleartext preface.
            Err(_) => break,
        }
    }
    classify(&head[..got])
}

fn classify(head: &[u8]) -> Wire {
    match head {
        // A TLS server either alerts or hangs up on bytes that are not a
        // ClientHello (rustls alerts, some stacks just close).
        [] => Wire::Tls,
        [TLS_ALERT | TLS_HANDSHAKE, 0x03, ..] => Wire::Tls,
        [_, _, _, SETTINGS, ..] => Wire::PlainH2,
        other => Wire::Unknown(format!(
            "unexpected first bytes {:02x?}; is this the gRPC port?",
            &other[..other.len().min(4)]
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_bytes_tell_tls_from_h2() {
        assert_eq!(classify(&[0x15, 0x03, 0x03, 0x00, 0x02]), Wire::Tls);
        assert_eq!(classify(&[]), Wire::Tls);
        assert_eq!(classify(&[0, 0, 6, 4, 0, 0, 0, 0, 0]), Wire::PlainH2);
        assert!(matches!(classify(b"HTTP/1.1 400"), Wire::Unknown(_)));
    }
}
