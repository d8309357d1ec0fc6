//! Cache tiers (§3.6).

use std::fmt;

/// Cache tier (§3.6). Built from the raw proto `CacheTier` number.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Tier(i32);

impl Tier {
    /// `CACHE_TIER_UNSPECIFIED`.
    pub const UNSPECIFIED: Tier = Tier(0);
    /// GPU HBM.
    pub const T1: Tier = Tier(1);
    /// Host memory.
    pub const T2: Tier = Tier(2);
    /// Disk / remote.
    pub const T3: Tier = Tier(3);
    /// Sentinel for a negative wire value: "invalid cold", colder than anything.
    pub const INVALID: Tier = Tier(i32::MAX);

    /// Proto → index: 0 → Unspecified, positive kept raw, negative → [`Tier::INVALID`].
    pub fn from_wire(v: i32) -> Tier {
        if v < 0 { Tier::INVALID } else { Tier(v) }
    }

    /// Index → proto: T1/T2/T3 → 1/2/3, anything else → 0 (UNSPECIFIED).
    pub fn to_wire(self) -> i32 {
        match self.0 {
            1..=3 => self.0,
            _ => 0,
        }
    }

    /// The raw internal number.
    pub fn raw(self) -> i32 {
        self.0
    }

    /// Ingest normalization: Unspecified → T1; everything else unchanged.
    pub fn normalized(self) -> Tier {
        if self == Tier::UNSPECIFIED {
            Tier::T1
        } else {
            self
        }
    }

    /// The colder of two tiers; Unspecified on either side wins.
    pub fn worst(a: Tier, b: Tier) -> Tier {
        if a == Tier::UNSPECIFIED || b == Tier::UNSPECIFIED {
            Tier::UNSPECIFIED
        } else if b.0 > a.0 {
            b
        } else {
            a
        }
    }
}

impl fmt::Debug for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => f.write_str("Unspecified"),
            1 => f.write_str("T1"),
            2 => f.write_str("T2"),
            3 => f.write_str("T3"),
            i32::MAX => f.write_str("Invalid"),
            n => write!(f, "Tier({n})"),
        }
    }
}

impl Default for Tier {
    fn default() -> Self {
        Tier::UNSPECIFIED
    }
}
