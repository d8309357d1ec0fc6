//! Trace-driven routing simulator: replays Mooncake traces through the real inference-cache stack and compares routing policies.
