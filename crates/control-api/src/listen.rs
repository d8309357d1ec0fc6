//! The listen-address forms every inference-cache listener accepts (server,
//! operator, sidecar): one parser, so a flag value that works on one
//! listener works on all of them.
//!
//! The forms are Go's `net.Listen` ones, as the reference's flags document
//! them: `:9090` (every interface), `0.0.0.0:9090`, `127.0.0.1:9090`,
//! `[::1]:9090` and `localhost:9090`. Host names other than `localhost` are
//! refused: a listener binds an address, and resolving a name at startup
//! would make the bound interface depend on DNS.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// A value that is not a listen address; the message names the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadListenAddr {
    /// The rejected value.
    pub value: String,
}

impl std::fmt::Display for BadListenAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:?} is not a listen address; use HOST:PORT, :PORT or [IPV6]:PORT (HOST an IP address or localhost)",
            self.value
        )
    }
}

impl std::error::Error for BadListenAddr {}

impl From<BadListenAddr> for std::io::Error {
    /// For listeners whose bind errors are `io::Error`s: a bad value is
    /// `InvalidInput`, reported like any other bind failure.
    fn from(e: BadListenAddr) -> Self {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, e.to_string())
    }
}

/// Parses a listen address in any of the accepted forms.
pub fn parse_listen_addr(value: &str) -> Result<SocketAddr, BadListenAddr> {
    let bad = || BadListenAddr {
        value: value.to_owned(),
    };
    let (host, port) = value.trim().rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    let ip = match host {
        "" => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        h => {
            let h = h
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .unwrap_or(h);
            h.parse().map_err(|_| bad())?
        }
    };
    Ok(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(s: &str) -> String {
        parse_listen_addr(s)
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    #[test]
    fn go_forms_parse() {
        assert_eq!(ok(":9443"), "0.0.0.0:9443");
        assert_eq!(ok(" :8080 "), "0.0.0.0:8080");
        assert_eq!(ok("0.0.0.0:9090"), "0.0.0.0:9090");
        assert_eq!(ok("127.0.0.1:0"), "127.0.0.1:0");
        assert_eq!(ok("localhost:8081"), "127.0.0.1:8081");
        assert_eq!(ok("[::1]:9090"), "[::1]:9090");
        assert_eq!(ok("[::]:9090"), "[::]:9090");
    }

    #[test]
    fn other_values_are_refused_with_the_forms() {
        for bad in [
            "",
            "9090",
            ":",
            ":http",
            ":70000",
            "example.com:80",
            "[::1:80",
            "::1",
        ] {
            let e = parse_listen_addr(bad).expect_err(bad);
            assert_eq!(e.value, bad);
            assert!(e.to_string().contains(":PORT"), "{e}");
        }
    }
}
