//! Flag parsing shared by the rigs.

pub(crate) use inferencecache_control_api::duration::parse_duration;
