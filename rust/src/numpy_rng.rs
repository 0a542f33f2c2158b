//! numpy's `np.random.default_rng(entropy).permutation(n)`, bit for bit, natively: partial
//! participation's draw of a round's participants (`permk.compressors.participation`: the
//! first `s` of `default_rng([seed, round, tag]).permutation(n)`, sorted) is a pinned stream
//! defined by numpy; this computes the same numbers without numpy's per-call overhead (a
//! `SeedSequence`, a `PCG64` and a `Generator` built for every round).
//!
//! Three pieces, each as numpy 1.17+ defines it (`numpy/random/bit_generator.pyx`,
//! `_pcg64.pyx` with `pcg64.c`, `_generator.pyx` with `distributions.c`):
//! * `SeedSequence(entropy)`: the entropy's integers as little-endian 32-bit words, hashed into a
//!   pool of four words ([`seed_sequence_pool`]), then `generate_state(4, uint64)`;
//! * `PCG64(seed_seq)`: the 128-bit LCG state and increment from those words, XSL-RR output;
//!   32-bit draws take the two halves of a 64-bit draw, low half first;
//! * `Generator.permutation(n)`: `arange(n)` shuffled from the end, each index drawn by
//!   masked rejection (`random_interval`).
//!
//! The tests of `tests/test_participation.py` compare it with numpy itself.

/// SeedSequence's hash constants (`bit_generator.pyx`).
const INIT_A: u32 = 0x43b0_d7e5;
const MULT_A: u32 = 0x931e_8875;
const INIT_B: u32 = 0x8b51_f9dd;
const MULT_B: u32 = 0x58f3_8ded;
const MIX_MULT_L: u32 = 0xca01_f9dd;
const MIX_MULT_R: u32 = 0x4973_f715;
const XSHIFT: u32 = 16;
const POOL: usize = 4;

/// PCG's default 128-bit multiplier.
const PCG_MULT: u128 = 0x2360_ED05_1FC6_5DA4_4385_DF64_9FCC_F645;

/// An integer as SeedSequence coerces it: its 32-bit words, least significant first (`[0]` for 0).
fn words(mut v: u64, out: &mut Vec<u32>) {
    if v == 0 {
        out.push(0);
        return;
    }
    while v > 0 {
        out.push(v as u32);
        v >>= 32;
    }
}

/// `mix(x, y)` of SeedSequence.
#[inline]
fn mix(x: u32, y: u32) -> u32 {
    let r = MIX_MULT_L.wrapping_mul(x).wrapping_sub(MIX_MULT_R.wrapping_mul(y));
    r ^ (r >> XSHIFT)
}

/// `SeedSequence(entropy).pool` (no spawn key, pool size 4).
pub fn seed_sequence_pool(entropy: &[u64]) -> [u32; POOL] {
    let mut ent = Vec::with_capacity(2 * entropy.len());
    entropy.iter().for_each(|&v| words(v, &mut ent));
    let mut hc = INIT_A;
    let mut hashmix = |v: u32| {
        let mut v = v ^ hc;
        hc = hc.wrapping_mul(MULT_A);
        v = v.wrapping_mul(hc);
        v ^ (v >> XSHIFT)
    };
    let mut mixer = [0u32; POOL];
    for (i, m) in mixer.iter_mut().enumerate() {
        *m = hashmix(ent.get(i).copied().unwrap_or(0));
    }
    for src in 0..POOL {
        for dst in 0..POOL {
            if src != dst {
                let h = hashmix(mixer[src]);
                mixer[dst] = mix(mixer[dst], h);
            }
        }
    }
    for &e in ent.iter().skip(POOL) {
        for m in mixer.iter_mut() {
            let h = hashmix(e);
            *m = mix(*m, h);
        }
    }
    mixer
}

/// `SeedSequence.generate_state(4, np.uint64)` from its pool.
pub fn generate_state(pool: &[u32; POOL]) -> [u64; 4] {
    let mut hc = INIT_B;
    let mut w = [0u32; 8];
    for (i, o) in w.iter_mut().enumerate() {
        let mut v = pool[i % POOL] ^ hc;
        hc = hc.wrapping_mul(MULT_B);
        v = v.wrapping_mul(hc);
        *o = v ^ (v >> XSHIFT);
    }
    [0, 1, 2, 3].map(|k| w[2 * k] as u64 | (w[2 * k + 1] as u64) << 32)
}

/// numpy's `PCG64` bit generator (XSL-RR 128/64) with its buffered 32-bit draws.
pub struct Pcg64 {
    state: u128,
    inc: u128,
    half: Option<u32>,
}

impl Pcg64 {
    /// `PCG64(SeedSequence(entropy))`.
    pub fn from_entropy(entropy: &[u64]) -> Self {
        let s = generate_state(&seed_sequence_pool(entropy));
        let initstate = (s[0] as u128) << 64 | s[1] as u128;
        let initseq = (s[2] as u128) << 64 | s[3] as u128;
        let mut g = Pcg64 { state: 0, inc: (initseq << 1) | 1, half: None };
        g.step();
        g.state = g.state.wrapping_add(initstate);
        g.step();
        g
    }

    #[inline(always)]
    fn step(&mut self) {
        self.state = self.state.wrapping_mul(PCG_MULT).wrapping_add(self.inc);
    }

    /// The state and increment (numpy's `bit_generator.state['state']`).
    pub fn state(&self) -> (u128, u128) {
        (self.state, self.inc)
    }

    /// `next_uint64`.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.step();
        let s = self.state;
        ((s >> 64) as u64 ^ s as u64).rotate_right((s >> 122) as u32)
    }

    /// `next_uint32`: the low half of a 64-bit draw, then its high half.
    #[inline]
    pub fn next_u32(&mut self) -> u32 {
        if let Some(h) = self.half.take() {
            return h;
        }
        let v = self.next_u64();
        self.half = Some((v >> 32) as u32);
        v as u32
    }

    /// `random_interval(max)`: uniform in `0..=max` by masked rejection.
    #[inline]
    pub fn interval(&mut self, max: u64) -> u64 {
        if max == 0 {
            return 0;
        }
        let mask = u64::MAX >> max.leading_zeros();
        if max <= u32::MAX as u64 {
            loop {
                let v = (self.next_u32() as u64) & mask;
                if v <= max {
                    return v;
                }
            }
        }
        loop {
            let v = self.next_u64() & mask;
            if v <= max {
                return v;
            }
        }
    }
}

/// `np.random.default_rng(entropy).permutation(n)` into `out` (cleared first).
pub fn permutation(entropy: &[u64], n: usize, out: &mut Vec<u64>) {
    let mut g = Pcg64::from_entropy(entropy);
    out.clear();
    out.extend(0..n as u64);
    for i in (1..n).rev() {
        let j = g.interval(i as u64) as usize;
        out.swap(i, j);
    }
}

/// The sorted first `s` of `np.random.default_rng(entropy).permutation(n)` (partial
/// participation's draw), after checking the memory of the permutation.
pub fn first_sorted(entropy: &[u64], n: usize, s: usize) -> crate::error::Result<Vec<i64>> {
    if s > n {
        return Err(crate::error::CoreError::invalid("s", format!("must be at most n = {n}, got {s}")));
    }
    crate::mem::Need::new().array::<u64>("the permutation", &[n]).array::<i64>("the participants", &[s]).check()?;
    let mut p = crate::mem::vec::<u64>("the permutation", n)?;
    permutation(entropy, n, &mut p);
    let mut out: Vec<i64> = p[..s].iter().map(|&v| v as i64).collect();
    out.sort_unstable();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pieces_are_numpys() {
        // numpy 2.4: SeedSequence([1, 17, 0x70617274]).pool, .generate_state(4, np.uint64),
        // PCG64(...).state
        assert_eq!(seed_sequence_pool(&[1, 17, 0x7061_7274]), [2868312546, 1342857814, 1586493462, 1476550947]);
        let s = generate_state(&seed_sequence_pool(&[1, 17, 0x7061_7274]));
        assert_eq!(s, [17700919832788563104, 15958129025413293679, 6374222944024616220, 4933400218571184278]);
        let g = Pcg64::from_entropy(&[1, 17, 0x7061_7274]);
        assert_eq!(g.state(), (73811241284484349006403348424934012473, 235167318634379080435990016522503991597));
    }

    #[test]
    fn a_permutation_is_a_permutation() {
        let mut p = Vec::new();
        for n in [0, 1, 2, 7, 100] {
            permutation(&[5, 3], n, &mut p);
            let mut s = p.clone();
            s.sort_unstable();
            assert_eq!(s, (0..n as u64).collect::<Vec<_>>());
        }
    }
}
