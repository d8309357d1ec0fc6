//! `inferencecache lookup`: one LookupRoute, printed readably or as JSON.

use super::output::{f32_json, latency, table, unhex};
use super::server::{Failure, OK, RUNTIME_ERROR, ServerArgs, block_on};
use clap::Args;
use inferencecache_client::{Hint, NoHintReason, RouteHint, RouteInput, RouteQuery};
use serde_json::json;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Shown after `-h`.
const EXAMPLES: &str = "Examples:\n  \
inferencecache lookup --tenant team-a --model llama-3-8b --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16\n  \
inferencecache lookup --tenant team-a --model llama-3-8b --tokens-file prompt.txt --json --shadow\n  \
inferencecache lookup --tenant team-a --model llama-3-8b --text 'Summarize this report' \\\n      \
--server http://inference-cache.inference-cache-system:9090\n  \
inferencecache lookup --tenant team-a --model m --hashes 9f1c2d3e4a5b6c7d,0011223344556677";

/// Shown after `--help`: what the tool does, then the examples. (The
/// subcommand's one-line about comes from its variant in `args.rs`.)
const LONG_HELP: &str = concat!(
    "Asks a running server for a routing hint, through the same fail-open client \
gateways use (inferencecache-client), and prints the reason code, the ranked replicas \
(score, matched tokens, cache tier, hit probability) and the latency.\n\n\
Each lookup counts as a request about to land on the first replica, as a gateway's does; \
add --shadow to look without leaving that trace (checks, dashboards).\n\n\
Give the prompt in one form: --tokens or --tokens-file (token ids; the server fingerprints \
them with its --engine-block-size), --text (the server applies the model's chat template and \
tokenizes; needs serve --tokenizer-models-dir), or --hashes (a block-hash chain you computed).\n\n\
--tenant, --model, --hash-scheme and --adapter must be what the engines' subscribers report \
under; a mismatch shows up as UNKNOWN_TENANT / UNKNOWN_MODEL / UNKNOWN_HASH_SCHEME.\n\n\
Exit status: 0 when the server answered (any reason code, NO_HINT included), 1 when it could \
not be asked (unreachable, no answer within --deadline, a gRPC error), 2 for bad flags.",
    "\n\n",
    "Examples:\n  \
inferencecache lookup --tenant team-a --model llama-3-8b --tokens 1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16\n  \
inferencecache lookup --tenant team-a --model llama-3-8b --tokens-file prompt.txt --json --shadow\n  \
inferencecache lookup --tenant team-a --model llama-3-8b --text 'Summarize this report' \\\n      \
--server http://inference-cache.inference-cache-system:9090\n  \
inferencecache lookup --tenant team-a --model m --hashes 9f1c2d3e4a5b6c7d,0011223344556677"
);

/// Flags of `lookup`.
#[derive(Debug, Args)]
#[command(after_help = EXAMPLES, after_long_help = LONG_HELP)]
pub(crate) struct LookupArgs {
    #[command(flatten)]
    server: ServerArgs,

    /// Tenant the engines report under (by convention their namespace).
    #[arg(long)]
    tenant: String,

    /// Model id as the engines serve it.
    #[arg(long)]
    model: String,

    /// Hash scheme the producers report under (`vllm` is the content
    /// fingerprint the kvevent-subscriber uses).
    #[arg(long, default_value = inferencecache_client::DEFAULT_HASH_SCHEME)]
    hash_scheme: String,

    /// LoRA adapter partition; leave empty for base-model traffic.
    #[arg(long, default_value = "")]
    adapter: String,

    /// The request's cache salt (vLLM / SGLang `cache_salt`): only blocks
    /// the engine stored under the same salt match. With
    /// --client-fingerprint the salt is folded into the chain here.
    #[arg(long, default_value = "")]
    cache_salt: String,

    /// Prompt token ids, comma-separated (e.g. 1,2,3).
    #[arg(long, value_delimiter = ',', num_args = 1.., group = "input")]
    tokens: Option<Vec<u32>>,

    /// File of token ids separated by commas, spaces or newlines (a JSON
    /// array works too).
    #[arg(long, value_name = "PATH", group = "input")]
    tokens_file: Option<PathBuf>,

    /// Prompt text; the server wraps it as one user message, applies the
    /// chat template and tokenizes.
    #[arg(long, group = "input")]
    text: Option<String>,

    /// Block-hash chain: hex hashes, comma-separated, first block first.
    #[arg(long, value_delimiter = ',', num_args = 1.., group = "input")]
    hashes: Option<Vec<String>>,

    /// Tokens per block of --hashes, comma-separated (default: --block-size
    /// for every block).
    #[arg(long, value_delimiter = ',', num_args = 1.., requires = "hashes")]
    token_counts: Option<Vec<i32>>,

    /// Fingerprint --tokens/--tokens-file here and send the block chain,
    /// as a gateway with a tokenizer does (the token ids never leave).
    #[arg(long)]
    client_fingerprint: bool,

    /// Tokens per KV block for --client-fingerprint and the --hashes
    /// default; must match the engines and the server.
    #[arg(long, default_value_t = inferencecache_client::DEFAULT_BLOCK_SIZE)]
    block_size: usize,

    /// Give up after this long (e.g. 20ms, 1s). Gateways use ~20ms; the tool
    /// defaults to a generous 1s so a remote server still answers.
    #[arg(long, default_value = "1s", value_parser = crate::args::parse_duration)]
    deadline: Duration,

    /// Time-to-first-token SLO to send with the request, in ms.
    #[arg(long, default_value_t = 0)]
    slo_ttft_ms: i32,

    /// Ask without delivering: the same answer, but the server records
    /// nothing for it (no queued work, tentative holding or delivered-hint
    /// count), as a check that sends no request should. Without it the
    /// server counts the lookup as a request about to land on its first
    /// replica.
    #[arg(long)]
    shadow: bool,

    /// Print one JSON object instead of the readable report.
    #[arg(long)]
    json: bool,
}

/// Runs `lookup`; returns the process exit code.
pub(crate) fn run(args: LookupArgs) -> ExitCode {
    let query = match query(&args) {
        Ok(q) => q,
        Err(message) => return Failure::flags(message).report("lookup"),
    };
    block_on("lookup", async move {
        let config = args.server.config().lookup_deadline(args.deadline);
        let client = args.server.connect(config).await?;
        let answer = client.lookup_route(&query).await;
        if args.json {
            println!("{}", to_json(&answer));
        } else {
            print!("{}", readable(&answer, &args));
        }
        Ok(exit_code(&answer.hint))
    })
}

/// The server answered (any code) → 0; the client could not ask → 1.
fn exit_code(hint: &Hint) -> u8 {
    match hint {
        Hint::NoHint(
            NoHintReason::DeadlineExceeded | NoHintReason::Unavailable | NoHintReason::Error(_),
        ) => RUNTIME_ERROR,
        _ => OK,
    }
}

fn query(args: &LookupArgs) -> Result<RouteQuery, String> {
    let input = input(args)?;
    let mut query = RouteQuery::new(args.tenant.clone(), args.model.clone(), input);
    query.hash_scheme.clone_from(&args.hash_scheme);
    query.adapter_id.clone_from(&args.adapter);
    query.cache_salt.clone_from(&args.cache_salt);
    query.slo_ttft_ms = args.slo_ttft_ms;
    query.shadow = args.shadow;
    Ok(query)
}

fn input(args: &LookupArgs) -> Result<RouteInput, String> {
    let tokens = match (&args.tokens, &args.tokens_file) {
        (Some(t), _) => Some(t.clone()),
        (None, Some(path)) => Some(read_tokens(path)?),
        (None, None) => None,
    };
    if args.client_fingerprint && tokens.is_none() {
        return Err("--client-fingerprint needs --tokens or --tokens-file".into());
    }
    if args.block_size == 0 {
        return Err("--block-size must be positive".into());
    }
    if let Some(tokens) = tokens {
        return Ok(if args.client_fingerprint {
            let (hashes, token_counts) = inferencecache_client::block_hashes_salted(
                &tokens,
                args.block_size,
                &args.cache_salt,
            );
            RouteInput::BlockHashes {
                hashes,
                token_counts,
            }
        } else {
            RouteInput::TokenIds(tokens)
        });
    }
    if let Some(text) = &args.text {
        return Ok(RouteInput::PromptText(text.clone()));
    }
    if let Some(hashes) = &args.hashes {
        let hashes = hashes
            .iter()
            .map(|h| unhex(h))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("--hashes: {e}"))?;
        let token_counts = match &args.token_counts {
            Some(c) if c.len() != hashes.len() => {
                return Err(format!(
                    "--token-counts has {} values but --hashes has {}; give one count per hash",
                    c.len(),
                    hashes.len()
                ));
            }
            Some(c) => c.clone(),
            None => {
                let size = i32::try_from(args.block_size)
                    .map_err(|_| "--block-size is too large".to_owned())?;
                vec![size; hashes.len()]
            }
        };
        return Ok(RouteInput::BlockHashes {
            hashes,
            token_counts,
        });
    }
    Err(
        "give the prompt: --tokens 1,2,3, --tokens-file PATH, --text '...', or --hashes HEX,HEX"
            .into(),
    )
}

/// Token ids separated by anything that is not a digit (commas, spaces,
/// newlines, JSON brackets).
fn read_tokens(path: &std::path::Path) -> Result<Vec<u32>, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--tokens-file {}: {e}", path.display()))?;
    if text.contains('-') || text.contains('.') {
        return Err(format!(
            "--tokens-file {}: token ids are non-negative integers",
            path.display()
        ));
    }
    text.split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .map_err(|_| format!("--tokens-file {}: {s} is not a token id", path.display()))
        })
        .collect()
}

fn hint_kind(hint: &Hint) -> &'static str {
    match hint {
        Hint::PrefixMatch(_) => "prefix_match",
        Hint::Affinity(_) => "affinity",
        Hint::TenantHot(_) => "tenant_hot",
        Hint::NoHint(_) => "no_hint",
    }
}

fn to_json(answer: &RouteHint) -> serde_json::Value {
    let candidates: Vec<serde_json::Value> = answer
        .hint
        .candidates()
        .iter()
        .map(|c| {
            json!({
                "replica_id": c.replica_id,
                "score": f32_json(c.score),
                "matched_tokens": c.matched_tokens,
                "hit_probability": f32_json(c.hit_probability),
                "tier": c.tier.as_str(),
            })
        })
        .collect();
    let mut out = json!({
        "reason_code": answer.hint.reason_code(),
        "hint": hint_kind(&answer.hint),
        "candidates": candidates,
        "latency_us": u64::try_from(answer.latency.as_micros()).unwrap_or(u64::MAX),
        "server_latency_us": answer.server_latency_us,
    });
    if let Hint::NoHint(NoHintReason::Error(message)) = &answer.hint {
        out["error"] = json!(message);
    }
    if !answer.token_ids.is_empty() {
        out["token_ids"] = json!(answer.token_ids);
    }
    out
}

fn readable(answer: &RouteHint, args: &LookupArgs) -> String {
    let hint = &answer.hint;
    let timing = if answer.server_latency_us > 0 {
        format!(
            "{} (server {} µs)",
            latency(answer.latency),
            answer.server_latency_us
        )
    } else {
        latency(answer.latency)
    };
    let mut out = format!("{}  in {timing}\n", hint.reason_code());
    match hint {
        Hint::NoHint(reason) => {
            out.push_str(&format!("  {}\n", explain(reason, args)));
        }
        _ => {
            out.push_str(&format!("  {}\n", meaning(hint)));
            let rows: Vec<Vec<String>> = hint
                .candidates()
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    vec![
                        (i + 1).to_string(),
                        c.replica_id.clone(),
                        format!("{:.2}", c.score),
                        c.matched_tokens.to_string(),
                        c.tier.as_str().to_owned(),
                        format!("{:.2}", c.hit_probability),
                    ]
                })
                .collect();
            out.push_str(&table(
                &["#", "REPLICA", "SCORE", "MATCHED", "TIER", "HIT_PROB"],
                &rows,
            ));
        }
    }
    if !answer.token_ids.is_empty() {
        out.push_str(&format!(
            "  server tokens ({}): forward these to the engine so its cache key matches\n",
            answer.token_ids.len()
        ));
    }
    out
}

fn meaning(hint: &Hint) -> &'static str {
    match hint {
        Hint::PrefixMatch(_) => "replicas that already cache a leading part of this prompt:",
        Hint::Affinity(_) => {
            "no cached prefix; a stable assignment for this prompt so repeats warm one replica:"
        }
        Hint::TenantHot(_) => "no cached prefix; replicas that are hot for this tenant:",
        Hint::NoHint(_) => "",
    }
}

fn explain(reason: &NoHintReason, args: &LookupArgs) -> String {
    match reason {
        NoHintReason::NoHint if args.text.is_some() => {
            "no replica is known to cache this prompt: route as usual. (--text also answers \
             NO_HINT when the server has no tokenizer for --model: serve --tokenizer-models-dir)"
                .into()
        }
        NoHintReason::NoHint => {
            "no replica is known to cache this prompt (or it is shorter than one block): \
             route as usual"
                .into()
        }
        NoHintReason::Timeout => {
            "the server's lookup budget (policy lookupTimeoutMs) ran out: route as usual".into()
        }
        NoHintReason::PolicyRequiresChain => format!(
            "tenant {:?}'s policy requires a block-hash chain: use --hashes or --client-fingerprint",
            args.tenant
        ),
        NoHintReason::UnknownTenant => format!(
            "no replica reports tenant {:?}: check --tenant against what the subscribers report \
             (see `inferencecache snapshot`)",
            args.tenant
        ),
        NoHintReason::UnknownModel => format!(
            "tenant {:?} has no entries for model {:?}: check --model",
            args.tenant, args.model
        ),
        NoHintReason::UnknownHashScheme => format!(
            "{:?}/{:?} has entries, but none under hash scheme {:?}: check --hash-scheme",
            args.tenant, args.model, args.hash_scheme
        ),
        NoHintReason::UnknownReason(code) => format!(
            "reason code {code:?} is not one this client acts on (or came without replicas): \
             a gateway routes as usual"
        ),
        NoHintReason::DeadlineExceeded => format!(
            "no answer within --deadline {:?}: the server may be overloaded; raise --deadline \
             to see what it would say",
            args.deadline
        ),
        NoHintReason::Unavailable => format!(
            "could not reach {}: is `inferencecache serve` running? pass --server",
            args.server.server
        ),
        NoHintReason::Error(message) => format!("the call failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        lookup: LookupArgs,
    }

    fn parse(extra: &[&str]) -> Result<LookupArgs, clap::Error> {
        let base = ["x", "--tenant", "t", "--model", "m"];
        Cli::try_parse_from(base.iter().chain(extra)).map(|c| c.lookup)
    }

    #[test]
    fn exactly_one_prompt_form() {
        assert!(parse(&["--tokens", "1,2", "--text", "hi"]).is_err());
        let none = parse(&[]).map(|a| input(&a));
        assert!(matches!(none, Ok(Err(_))));
        let a = parse(&["--tokens", "1,2,3"]).unwrap();
        assert_eq!(input(&a), Ok(RouteInput::TokenIds(vec![1, 2, 3])));
    }

    #[test]
    fn hashes_default_their_counts_to_the_block_size() {
        let a = parse(&["--hashes", "0011223344556677,8899aabbccddeeff"]).unwrap();
        let Ok(RouteInput::BlockHashes {
            hashes,
            token_counts,
        }) = input(&a)
        else {
            panic!("chain expected");
        };
        assert_eq!(
            hashes[1],
            vec![0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]
        );
        assert_eq!(token_counts, vec![16, 16]);
        let a = parse(&["--hashes", "00", "--token-counts", "1,2"]).unwrap();
        assert!(input(&a).unwrap_err().contains("one count per hash"));
        assert!(parse(&["--token-counts", "1"]).is_err(), "needs --hashes");
    }

    #[test]
    fn client_fingerprint_sends_a_chain() {
        let tokens: Vec<String> = (0..32).map(|t| t.to_string()).collect();
        let joined = tokens.join(",");
        let a = parse(&["--tokens", &joined, "--client-fingerprint"]).unwrap();
        assert!(matches!(
            input(&a),
            Ok(RouteInput::BlockHashes { hashes, .. }) if hashes.len() == 2
        ));
    }

    #[test]
    fn client_side_failures_exit_1_server_answers_exit_0() {
        assert_eq!(exit_code(&Hint::NoHint(NoHintReason::UnknownTenant)), OK);
        assert_eq!(
            exit_code(&Hint::NoHint(NoHintReason::Unavailable)),
            RUNTIME_ERROR
        );
    }
}
