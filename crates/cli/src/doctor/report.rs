//! Doctor's findings and how they are printed: one line per check, a `fix:`
//! line under every one that is not ok, a summary; or one JSON document.

use serde_json::{Value, json};

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Status {
    /// Works.
    Ok,
    /// Works, but something an operator likely wants to change.
    Warn,
    /// Broken: doctor exits 1.
    Fail,
    /// Not run, because something it needs failed first.
    Skip,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "FAIL",
            Self::Skip => "skip",
        }
    }

    fn json(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Warn => "warn",
            Self::Fail => "fail",
            Self::Skip => "skip",
        }
    }
}

/// One step of the diagnosis.
#[derive(Debug, Clone)]
pub(super) struct Check {
    /// Stable name (`server.grpc`, `sidecar.engine`, ...) for scripts.
    pub name: String,
    /// Outcome.
    pub status: Status,
    /// What was seen.
    pub detail: String,
    /// What to do about it (empty when ok).
    pub remediation: String,
}

impl Check {
    /// A passing check.
    pub(super) fn ok(name: impl Into<String>, detail: impl Into<String>) -> Self {
        Self::new(name, Status::Ok, detail, "")
    }

    /// A finding with its remediation.
    pub(super) fn new(
        name: impl Into<String>,
        status: Status,
        detail: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        Self {
            name: name.into(),
            status,
            detail: detail.into(),
            remediation: remediation.into(),
        }
    }

    /// A failure with its remediation.
    pub(super) fn fail(
        name: impl Into<String>,
        detail: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        Self::new(name, Status::Fail, detail, remediation)
    }

    /// A warning with its remediation.
    pub(super) fn warn(
        name: impl Into<String>,
        detail: impl Into<String>,
        remediation: impl Into<String>,
    ) -> Self {
        Self::new(name, Status::Warn, detail, remediation)
    }

    /// Not run because `because` failed.
    pub(super) fn skip(name: impl Into<String>, because: &str) -> Self {
        Self::new(name, Status::Skip, format!("not run: {because}"), "")
    }
}

/// True when no check failed.
pub(super) fn healthy(checks: &[Check]) -> bool {
    checks.iter().all(|c| c.status != Status::Fail)
}

/// The readable report.
pub(super) fn text(checks: &[Check]) -> String {
    let width = checks.iter().map(|c| c.name.len()).max().unwrap_or(0);
    let mut out = String::new();
    for c in checks {
        out.push_str(&format!(
            "{:<4}  {:<width$}  {}\n",
            c.status.label(),
            c.name,
            c.detail
        ));
        if !c.remediation.is_empty() {
            out.push_str(&format!("      {:<width$}  fix: {}\n", "", c.remediation));
        }
    }
    let count = |s: Status| checks.iter().filter(|c| c.status == s).count();
    out.push_str(&format!(
        "\n{} ok, {} warning(s), {} failed, {} skipped: {}\n",
        count(Status::Ok),
        count(Status::Warn),
        count(Status::Fail),
        count(Status::Skip),
        if healthy(checks) {
            "healthy"
        } else {
            "NOT healthy"
        }
    ));
    out
}

/// The JSON report (`--json`).
pub(super) fn json(checks: &[Check]) -> Value {
    json!({
        "healthy": healthy(checks),
        "checks": checks.iter().map(|c| json!({
            "name": c.name,
            "status": c.status.json(),
            "detail": c.detail,
            "remediation": c.remediation,
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_prints_its_fix_and_makes_it_unhealthy() {
        let checks = [
            Check::ok("server.grpc", "up"),
            Check::fail(
                "sidecar.engine",
                "down",
                "point --engine-endpoint at the engine",
            ),
        ];
        let t = text(&checks);
        assert!(t.contains("FAIL  sidecar.engine  down"), "{t}");
        assert!(t.contains("fix: point --engine-endpoint"), "{t}");
        assert!(t.contains("NOT healthy"), "{t}");
        assert_eq!(json(&checks)["healthy"], false);
        assert_eq!(json(&checks)["checks"][1]["status"], "fail");
    }
}
