//! `--address-override`: where doctor reaches a discovered Service or pod
//! when its cluster address is not routable from here (a laptop outside the
//! pod network, or a test apiserver with no nodes). The syntax mirrors
//! `kubectl port-forward`, which is how an operator gets such an address:
//! `svc/NAME=HOST` (every port of the object, same numbers, as
//! `kubectl port-forward svc/NAME 9090 8080 8081` gives) or
//! `svc/NAME:REMOTE=HOST:LOCAL` (one port, as `LOCAL:REMOTE` forwards
//! give). `pod/[NAMESPACE/]NAME` works the same for sidecar pods.

/// Which kind of object a rule names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// A Service (the server's).
    Service,
    /// A pod (an engine with a sidecar).
    Pod,
}

/// One `--address-override` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Rule {
    kind: Kind,
    namespace: Option<String>,
    name: String,
    port: Option<u16>,
    host: String,
    to_port: Option<u16>,
}

fn split_port(s: &str, what: &str) -> Result<(String, Option<u16>), String> {
    // A bracketed IPv6 host keeps its colons.
    let port_colon = if s.starts_with('[') {
        s.find(']')
            .and_then(|end| s[end..].find(':').map(|c| end + c))
    } else {
        s.rfind(':')
    };
    match port_colon {
        None => Ok((s.to_owned(), None)),
        Some(i) => {
            let port = s[i + 1..]
                .parse::<u16>()
                .map_err(|_| format!("{what} {s:?}: {:?} is not a port", &s[i + 1..]))?;
            Ok((s[..i].to_owned(), Some(port)))
        }
    }
}

/// Parses `KIND/[NS/]NAME[:PORT]=HOST[:PORT]` (clap's value parser).
pub(super) fn parse(value: &str) -> Result<Rule, String> {
    let usage = "use svc/NAME=HOST, svc/NAME:PORT=HOST:PORT or pod/NAMESPACE/NAME:PORT=HOST:PORT";
    let (object, target) = value
        .split_once('=')
        .ok_or_else(|| format!("{value:?}: no '='; {usage}"))?;
    let (kind, rest) = object
        .split_once('/')
        .ok_or_else(|| format!("{value:?}: no KIND/; {usage}"))?;
    let kind = match kind {
        "svc" | "service" | "services" => Kind::Service,
        "pod" | "pods" => Kind::Pod,
        other => return Err(format!("{value:?}: kind {other:?} is not svc or pod")),
    };
    let (path, port) = split_port(rest, "object")?;
    let (namespace, name) = match path.split_once('/') {
        Some((ns, name)) => (Some(ns.to_owned()), name.to_owned()),
        None => (None, path),
    };
    let (host, to_port) = split_port(target, "address")?;
    if name.is_empty() || host.is_empty() {
        return Err(format!("{value:?}: empty name or host; {usage}"));
    }
    if port.is_none() && to_port.is_some() {
        return Err(format!(
            "{value:?}: a local port needs the remote one too (svc/NAME:REMOTE=HOST:LOCAL)"
        ));
    }
    Ok(Rule {
        kind,
        namespace,
        name,
        port,
        host,
        to_port,
    })
}

/// Where to dial `port` of the object `kind namespace/name`, if a rule
/// says (a rule for that port wins over one for the whole object).
pub(super) fn lookup(
    rules: &[Rule],
    kind: Kind,
    namespace: &str,
    name: &str,
    port: u16,
) -> Option<String> {
    let names_it = |r: &&Rule| {
        r.kind == kind && r.name == name && r.namespace.as_deref().is_none_or(|n| n == namespace)
    };
    let exact = rules.iter().filter(names_it).find(|r| r.port == Some(port));
    let rule = exact.or_else(|| rules.iter().filter(names_it).find(|r| r.port.is_none()))?;
    Some(format!("{}:{}", rule.host, rule.to_port.unwrap_or(port)))
}

/// True when some rule names the object (any port).
pub(super) fn names(rules: &[Rule], kind: Kind, namespace: &str, name: &str) -> bool {
    rules.iter().any(|r| {
        r.kind == kind && r.name == name && r.namespace.as_deref().is_none_or(|n| n == namespace)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_forward_shapes() {
        let whole = parse("svc/inference-cache-server=127.0.0.1").unwrap();
        let one = parse("svc/inference-cache-server:8081=localhost:18081").unwrap();
        let pod = parse("pod/team-a/vllm-0:8090=[::1]:18090").unwrap();
        let rules = [one, whole, pod];
        let svc = |port| lookup(&rules, Kind::Service, "ic", "inference-cache-server", port);
        assert_eq!(svc(9090).as_deref(), Some("127.0.0.1:9090"));
        assert_eq!(svc(8081).as_deref(), Some("localhost:18081"));
        let pod = |ns| lookup(&rules, Kind::Pod, ns, "vllm-0", 8090);
        assert_eq!(pod("team-a").as_deref(), Some("[::1]:18090"));
        assert_eq!(pod("team-b"), None);
        assert!(names(&rules, Kind::Pod, "team-a", "vllm-0"));
        assert!(!names(&rules, Kind::Service, "team-a", "vllm-0"));
    }

    #[test]
    fn unusable_values_say_why() {
        for bad in [
            "inference-cache-server=127.0.0.1",
            "svc/x",
            "deploy/x=h",
            "svc/x=h:notaport",
            "svc/x=h:9090",
            "svc/=h",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
    }
}
