//! `--plot`: an `.svg` path writes the SVG and a PNG next to it, a `.png`
//! path only the PNG, anything else is refused. The PNG is a real PNG of
//! the figure's size with drawn content (not a blank canvas).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use inferencecache_simulator::{
    PolicyKind, SimConfig, TraceRequest, Workload, parse_trace, simulate, write_plot,
};

/// Two conversations of two turns each (known_answer.rs's trace).
const TRACE: &str = r#"{"timestamp": 0, "input_length": 1536, "output_length": 10, "hash_ids": [0, 1, 2]}
{"timestamp": 10000, "input_length": 1536, "output_length": 10, "hash_ids": [0, 5, 6]}
{"timestamp": 20000, "input_length": 2560, "output_length": 10, "hash_ids": [0, 1, 2, 3, 4]}
{"timestamp": 30000, "input_length": 2560, "output_length": 10, "hash_ids": [0, 5, 6, 7, 8]}
"#;

/// (width, height) from a PNG's IHDR chunk.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    assert_eq!(&bytes[12..16], b"IHDR");
    let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
    (be(&bytes[16..20]), be(&bytes[20..24]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn svg_path_writes_svg_and_png_png_path_writes_png() {
    let mut config = SimConfig::default();
    config.settings.replicas = 2;
    config.settings.buckets = 4;
    config.policies = vec![PolicyKind::RoundRobin, PolicyKind::Oracle];
    let trace: Vec<TraceRequest> = parse_trace(TRACE.as_bytes(), "tiny", None).unwrap();
    let workload = Workload::new("tiny", trace, &config.settings);
    let report = simulate(&config, &workload).await.unwrap();

    let dir = std::env::temp_dir().join(format!("sim-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let written = write_plot(&report, &dir.join("fig.svg")).unwrap();
    assert_eq!(written, [dir.join("fig.svg"), dir.join("fig.png")]);
    let svg = std::fs::read_to_string(dir.join("fig.svg")).unwrap();
    assert!(svg.contains("<svg") && svg.contains("hit rate"));
    let png = std::fs::read(dir.join("fig.png")).unwrap();
    assert_eq!(png_size(&png), (1100, 760));
    // A white canvas compresses to almost nothing; axes, text and lines do not.
    assert!(png.len() > 20_000, "PNG of {} bytes looks blank", png.len());

    let only = dir.join("only.png");
    assert_eq!(
        write_plot(&report, &only).unwrap(),
        std::slice::from_ref(&only)
    );
    assert!(!dir.join("only.svg").exists());
    assert!(write_plot(&report, &dir.join("fig.txt")).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}
