//! The webhook's own certificate authority, so the default install needs no
//! cert-manager: a CA and a serving certificate for the webhook Service's
//! DNS names, kept in one Secret (cert-manager's layout plus `ca.key`), and
//! the rule that decides when to rotate them.
//!
//! Pure: [`plan`] looks at what the Secret holds and the time, and
//! [`Bundle::issue`] / [`Bundle::renew_leaf`] / [`Bundle::rotate_ca`] make the
//! new contents; [`super::provision`] does the Kubernetes I/O.
//!
//! Rotation never breaks a handshake: a new serving certificate is signed by
//! the same CA; a new CA is added to `ca.crt` beside the old one (the
//! `caBundle` the apiserver trusts holds both) until the old one expires.

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The CA's common name (its issuer name in every serving certificate).
const CA_NAME: &str = "inference-cache webhook CA";
/// Certificates start this long before "now", for clock skew between nodes.
const BACKDATE: Duration = Duration::from_secs(3600);

/// Why a certificate could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// rcgen refused (a bad DNS name, a key it cannot use).
    #[error("make certificate: {0}")]
    Make(#[from] rcgen::Error),
    /// Stored PEM that cannot be used.
    #[error("{0}")]
    Invalid(String),
}

/// How long certificates live and when they are renewed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lifetimes {
    /// CA validity.
    pub ca: Duration,
    /// Serving certificate validity.
    pub leaf: Duration,
    /// Renew a certificate when less than this fraction of its lifetime is
    /// left (in percent).
    pub renew_below_percent: u32,
}

impl Default for Lifetimes {
    /// A 10-year CA and a 1-year serving certificate, renewed with a third
    /// of their lifetime left (cert-manager's default rule).
    fn default() -> Self {
        Self {
            ca: Duration::from_secs(10 * 365 * 86_400),
            leaf: Duration::from_secs(365 * 86_400),
            renew_below_percent: 33,
        }
    }
}

/// The Secret's contents, as PEM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    /// The CAs the apiserver must trust, newest first (`ca.crt`).
    pub ca_crt: String,
    /// The current CA's key (`ca.key`).
    pub ca_key: String,
    /// The serving certificate (`tls.crt`).
    pub tls_crt: String,
    /// Its key (`tls.key`).
    pub tls_key: String,
}

/// What a check decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Everything is current.
    Keep,
    /// A new serving certificate from the same CA (why).
    RenewLeaf(String),
    /// A new CA and serving certificate (why).
    RotateCa(String),
    /// Nothing usable is stored: start over (why).
    Issue(String),
}

fn offset(t: SystemTime) -> time::OffsetDateTime {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    time::OffsetDateTime::from_unix_timestamp(secs).unwrap_or(time::OffsetDateTime::UNIX_EPOCH)
}

fn ca_params(now: SystemTime, life: Duration) -> Result<CertificateParams, CertError> {
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    p.not_before = offset(now - BACKDATE);
    p.not_after = offset(now + life);
    Ok(p)
}

/// The current CA as an issuer: its name and key are all a signature needs,
/// so the stored certificate is not re-parsed.
fn ca_issuer(ca_key: &str) -> Result<Issuer<'static, KeyPair>, CertError> {
    let key = KeyPair::from_pem(ca_key)
        .map_err(|e| CertError::Invalid(format!("ca.key is not a usable key: {e}")))?;
    let mut p = CertificateParams::new(Vec::<String>::new())?;
    p.distinguished_name.push(DnType::CommonName, CA_NAME);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    Ok(Issuer::new(p, key))
}

fn leaf(
    issuer: &Issuer<'_, KeyPair>,
    dns: &[String],
    now: SystemTime,
    life: Duration,
) -> Result<(String, String), CertError> {
    let key = KeyPair::generate()?;
    let mut p = CertificateParams::new(dns.to_vec())?;
    p.distinguished_name.push(
        DnType::CommonName,
        dns.first().map_or("webhook", String::as_str),
    );
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    p.not_before = offset(now - BACKDATE);
    p.not_after = offset(now + life);
    let cert = p.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// One parsed certificate's facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFacts {
    /// Validity start (Unix seconds).
    pub not_before: i64,
    /// Validity end (Unix seconds).
    pub not_after: i64,
    /// Its DNS subject alternative names.
    pub dns: Vec<String>,
    /// Its issuer's common name.
    pub issuer_cn: String,
}

/// The certificates of a PEM text, in order.
pub fn parse_pem(pem: &str) -> Result<Vec<CertFacts>, CertError> {
    let ders: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Invalid(format!("not PEM certificates: {e}")))?;
    ders.iter()
        .map(|der| {
            let (_, c) = x509_parser::parse_x509_certificate(der)
                .map_err(|e| CertError::Invalid(format!("not an X.509 certificate: {e}")))?;
            let dns = c
                .subject_alternative_name()
                .ok()
                .flatten()
                .map(|san| {
                    san.value
                        .general_names
                        .iter()
                        .filter_map(|n| match n {
                            x509_parser::extensions::GeneralName::DNSName(d) => {
                                Some((*d).to_owned())
                            }
                            _ => None,
                        })
                        .collect()
                })
                .unwrap_or_default();
            let issuer_cn = c
                .issuer()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .unwrap_or_default()
                .to_owned();
            Ok(CertFacts {
                not_before: c.validity().not_before.timestamp(),
                not_after: c.validity().not_after.timestamp(),
                dns,
                issuer_cn,
            })
        })
        .collect()
}

fn unix(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

/// Whether less than `percent` of the certificate's lifetime is left.
fn due(c: &CertFacts, now: i64, percent: u32) -> bool {
    let life = (c.not_after - c.not_before).max(1);
    let left = c.not_after - now;
    left.saturating_mul(100) < life.saturating_mul(i64::from(percent))
}

/// Decides what to do with what the Secret holds (`None`: no Secret).
pub fn plan(stored: Option<&Bundle>, dns: &[String], now: SystemTime, life: Lifetimes) -> Plan {
    let Some(b) = stored else {
        return Plan::Issue("no certificate Secret yet".into());
    };
    let now = unix(now);
    let cas = match parse_pem(&b.ca_crt) {
        Ok(c) if !c.is_empty() => c,
        Ok(_) => return Plan::Issue("ca.crt holds no certificate".into()),
        Err(e) => return Plan::Issue(format!("ca.crt: {e}")),
    };
    if ca_issuer(&b.ca_key).is_err() {
        return Plan::Issue("ca.key is not a usable key".into());
    }
    let ca = &cas[0];
    if ca.not_after <= now || due(ca, now, life.renew_below_percent) {
        return Plan::RotateCa(format!(
            "the CA expires at {} (unix), within the renewal window",
            ca.not_after
        ));
    }
    let tls = match parse_pem(&b.tls_crt) {
        Ok(mut c) if !c.is_empty() => c.swap_remove(0),
        Ok(_) => return Plan::RenewLeaf("tls.crt holds no certificate".into()),
        Err(e) => return Plan::RenewLeaf(format!("tls.crt: {e}")),
    };
    if KeyPair::from_pem(&b.tls_key).is_err() {
        return Plan::RenewLeaf("tls.key is not a usable key".into());
    }
    if tls.issuer_cn != CA_NAME {
        return Plan::RenewLeaf(format!(
            "tls.crt was issued by {:?}, not this CA",
            tls.issuer_cn
        ));
    }
    let mut want: Vec<&String> = dns.iter().collect();
    let mut have: Vec<&String> = tls.dns.iter().collect();
    want.sort();
    have.sort();
    if want != have {
        return Plan::RenewLeaf(format!(
            "tls.crt names {have:?}, the Service needs {want:?}"
        ));
    }
    if tls.not_after <= now || due(&tls, now, life.renew_below_percent) {
        return Plan::RenewLeaf(format!(
            "tls.crt expires at {} (unix), within the renewal window",
            tls.not_after
        ));
    }
    Plan::Keep
}

impl Bundle {
    /// A new CA and a serving certificate for `dns`.
    pub fn issue(dns: &[String], now: SystemTime, life: Lifetimes) -> Result<Self, CertError> {
        let ca_key = KeyPair::generate()?;
        let ca_cert = ca_params(now, life.ca)?.self_signed(&ca_key)?;
        let ca_key = ca_key.serialize_pem();
        let (tls_crt, tls_key) = leaf(&ca_issuer(&ca_key)?, dns, now, life.leaf)?;
        Ok(Self {
            ca_crt: ca_cert.pem(),
            ca_key,
            tls_crt,
            tls_key,
        })
    }

    /// A new serving certificate from the same CA.
    pub fn renew_leaf(
        &self,
        dns: &[String],
        now: SystemTime,
        life: Lifetimes,
    ) -> Result<Self, CertError> {
        let (tls_crt, tls_key) = leaf(&ca_issuer(&self.ca_key)?, dns, now, life.leaf)?;
        Ok(Self {
            tls_crt,
            tls_key,
            ..self.clone()
        })
    }

    /// A new CA (trusted beside the old one while that is still valid) and
    /// a serving certificate from it.
    pub fn rotate_ca(
        &self,
        dns: &[String],
        now: SystemTime,
        life: Lifetimes,
    ) -> Result<Self, CertError> {
        let fresh = Self::issue(dns, now, life)?;
        let now = unix(now);
        // Keep the previous CAs that are still valid, so a replica still
        // serving the old certificate stays trusted until it reloads.
        let mut ca_crt = fresh.ca_crt.clone();
        let olds: Vec<CertificateDer<'static>> =
            CertificateDer::pem_slice_iter(self.ca_crt.as_bytes())
                .filter_map(Result::ok)
                .collect();
        for (der, facts) in olds.iter().zip(parse_pem(&self.ca_crt).unwrap_or_default()) {
            if facts.not_after > now {
                ca_crt.push_str(&pem_of(der));
            }
        }
        Ok(Self { ca_crt, ..fresh })
    }

    /// Applies a plan (`None` for [`Plan::Keep`]).
    pub fn apply(
        stored: Option<&Self>,
        plan: &Plan,
        dns: &[String],
        now: SystemTime,
        life: Lifetimes,
    ) -> Result<Option<Self>, CertError> {
        Ok(match (plan, stored) {
            (Plan::Keep, _) => None,
            (Plan::RenewLeaf(_), Some(b)) => Some(b.renew_leaf(dns, now, life)?),
            (Plan::RotateCa(_), Some(b)) => Some(b.rotate_ca(dns, now, life)?),
            _ => Some(Self::issue(dns, now, life)?),
        })
    }
}

fn pem_of(der: &CertificateDer<'_>) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der.as_ref());
    let mut out = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str("-----END CERTIFICATE-----\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: Duration = Duration::from_secs(86_400);

    fn dns() -> Vec<String> {
        vec![
            "inference-cache-webhook-service.ns.svc".into(),
            "inference-cache-webhook-service.ns.svc.cluster.local".into(),
        ]
    }

    fn life() -> Lifetimes {
        Lifetimes {
            ca: 300 * DAY,
            leaf: 30 * DAY,
            renew_below_percent: 33,
        }
    }

    #[test]
    fn a_fresh_bundle_is_kept_and_names_the_service() {
        let now = SystemTime::now();
        assert!(matches!(plan(None, &dns(), now, life()), Plan::Issue(_)));
        let b = Bundle::issue(&dns(), now, life()).unwrap();
        assert_eq!(plan(Some(&b), &dns(), now, life()), Plan::Keep);
        let tls = &parse_pem(&b.tls_crt).unwrap()[0];
        assert_eq!(tls.dns, dns());
        assert_eq!(tls.issuer_cn, CA_NAME);
        let ca = &parse_pem(&b.ca_crt).unwrap()[0];
        assert!(ca.not_after - ca.not_before >= 300 * 86_400);
    }

    #[test]
    fn the_serving_certificate_rotates_before_it_expires_and_keeps_the_ca() {
        let t0 = SystemTime::now();
        let b = Bundle::issue(&dns(), t0, life()).unwrap();
        // 19 of 30 days in: 11 days (37%) left, nothing to do.
        assert_eq!(plan(Some(&b), &dns(), t0 + 19 * DAY, life()), Plan::Keep);
        // 21 days in: 9 days (30%) left, below a third.
        let t1 = t0 + 21 * DAY;
        let p = plan(Some(&b), &dns(), t1, life());
        assert!(matches!(p, Plan::RenewLeaf(_)), "{p:?}");
        let b1 = Bundle::apply(Some(&b), &p, &dns(), t1, life())
            .unwrap()
            .unwrap();
        assert_eq!(b1.ca_crt, b.ca_crt, "same CA: nothing to re-inject");
        assert_eq!(b1.ca_key, b.ca_key);
        assert_ne!(b1.tls_crt, b.tls_crt);
        assert_eq!(plan(Some(&b1), &dns(), t1, life()), Plan::Keep);
        let new_tls = &parse_pem(&b1.tls_crt).unwrap()[0];
        assert!(new_tls.not_after > unix(t1) + 29 * 86_400);
        // Past expiry is renewed too.
        assert!(matches!(
            plan(Some(&b), &dns(), t0 + 40 * DAY, life()),
            Plan::RenewLeaf(_)
        ));
    }

    #[test]
    fn a_renamed_service_or_a_foreign_certificate_is_reissued() {
        let now = SystemTime::now();
        let b = Bundle::issue(&dns(), now, life()).unwrap();
        let other = vec!["other.ns.svc".to_owned()];
        assert!(matches!(
            plan(Some(&b), &other, now, life()),
            Plan::RenewLeaf(_)
        ));
        let foreign = Bundle::issue(&dns(), now, life()).unwrap();
        let mixed = Bundle {
            tls_crt: "garbage".into(),
            ..foreign.clone()
        };
        assert!(matches!(
            plan(Some(&mixed), &dns(), now, life()),
            Plan::RenewLeaf(_)
        ));
        let broken = Bundle {
            ca_key: "nope".into(),
            ..foreign
        };
        assert!(matches!(
            plan(Some(&broken), &dns(), now, life()),
            Plan::Issue(_)
        ));
    }

    #[test]
    fn the_ca_rotates_with_the_old_one_still_trusted_until_it_expires() {
        let t0 = SystemTime::now();
        let b = Bundle::issue(&dns(), t0, life()).unwrap();
        // 210 of 300 days in: 30% left.
        let t1 = t0 + 210 * DAY;
        let p = plan(Some(&b), &dns(), t1, life());
        assert!(matches!(p, Plan::RotateCa(_)), "{p:?}");
        let b1 = Bundle::apply(Some(&b), &p, &dns(), t1, life())
            .unwrap()
            .unwrap();
        let cas = parse_pem(&b1.ca_crt).unwrap();
        assert_eq!(cas.len(), 2, "new CA first, the old one kept");
        assert!(cas[0].not_after > cas[1].not_after);
        assert!(b1.ca_crt.ends_with(&b.ca_crt), "the old CA verbatim");
        assert_ne!(b1.ca_key, b.ca_key);
        assert_eq!(plan(Some(&b1), &dns(), t1, life()), Plan::Keep);
        // Once the old CA expired, the next rotation drops it.
        let t2 = t0 + 420 * DAY;
        let b2 = b1.rotate_ca(&dns(), t2, life()).unwrap();
        assert_eq!(parse_pem(&b2.ca_crt).unwrap().len(), 2);
        let t3 = t0 + 1000 * DAY;
        let b3 = b2.rotate_ca(&dns(), t3, life()).unwrap();
        assert_eq!(parse_pem(&b3.ca_crt).unwrap().len(), 1);
    }

    #[test]
    fn pem_reencoding_is_byte_identical() {
        let b = Bundle::issue(&dns(), SystemTime::now(), life()).unwrap();
        let der = CertificateDer::pem_slice_iter(b.ca_crt.as_bytes())
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(pem_of(&der).trim(), b.ca_crt.trim());
    }
}
