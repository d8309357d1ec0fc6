//! The few HTTP calls doctor makes, with failures kept as text.

use std::time::Duration;

/// An HTTP answer: status code and body.
#[derive(Debug)]
pub(super) struct Answer {
    /// Status code.
    pub status: u16,
    /// Body text.
    pub body: String,
}

/// GETs or POSTs `url`; `Err` carries why nothing answered.
pub(super) async fn call(
    url: &str,
    token: Option<&str>,
    post: Option<String>,
    timeout: Duration,
) -> Result<Answer, String> {
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let mut request = match post {
        Some(body) => client
            .post(url)
            .header("content-type", "application/json")
            .body(body),
        None => client.get(url),
    };
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    let response = request
        .send()
        .await
        .map_err(|e| crate::tools::snapshot::error_chain(&e))?;
    let status = response.status().as_u16();
    let body = response
        .text()
        .await
        .map_err(|e| crate::tools::snapshot::error_chain(&e))?;
    Ok(Answer { status, body })
}

/// Samples of a Prometheus text body whose series starts with `prefix`
/// (name plus, optionally, the opening of its labels).
pub(super) fn samples<'a>(
    body: &'a str,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    body.lines()
        .filter(move |l| l.starts_with(prefix))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            Some((series, value.trim().parse().ok()?))
        })
}
