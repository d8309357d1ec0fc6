//! Gateway SDK for inference-cache: fail-open LookupRoute with hard deadlines, typed hints, fingerprinting, producer helpers.
