//! The block permutation compressor ("More Examples of Permutation-Based Compressors"): the
//! coordinates are partitioned into `m <= n` blocks; a shared permutation of the workers gives
//! `q = ⌊n/m⌋` workers each block (the `r = n − mq` others are idle); values are scaled by
//! `n/q`.

use ndarray::ArrayView2;

use super::{Footprint, Sparsify};
use crate::error::{CoreError, Result};
use crate::params::Params;
use crate::plan::{self, Assignment, Blocks, CsrArrays, Ranges};
use crate::real::Real;
use crate::rng::{self, permutation, Purpose, SHARED};
use crate::mem;

/// A partition of the coordinates into blocks.
#[derive(Clone, Debug, PartialEq)]
pub enum Partition {
    /// `m` contiguous blocks: block `b` is `⌊b·d/m⌋ .. ⌊(b+1)·d/m⌋`.
    Contiguous { m: usize },
    /// `labels[j]` is the block of coordinate `j`; blocks `0..m` all non-empty. `bounds` are
    /// the blocks' boundaries when every block is a range (the labels are sorted).
    Labels { labels: Vec<u32>, m: usize, bounds: Option<Vec<usize>> },
}

impl Partition {
    pub fn labels(labels: Vec<u32>) -> Result<Self> {
        if labels.is_empty() {
            return Err(CoreError::invalid("partition", "must label at least one coordinate"));
        }
        let m = labels.iter().map(|&l| l as usize).max().unwrap_or(0) + 1;
        if m > labels.len() {
            // m non-empty blocks need at least m coordinates (and this bounds the allocation).
            return Err(CoreError::invalid(
                "partition",
                format!("block labels must be 0..m-1 with every block non-empty; label {} needs more than {} coordinates", m - 1, labels.len()),
            ));
        }
        let mut seen = mem::filled("the partition's blocks", m, false)?;
        for &l in &labels {
            seen[l as usize] = true;
        }
        if let Some(b) = seen.iter().position(|s| !s) {
            return Err(CoreError::invalid(
                "partition",
                format!("block labels must be 0..m-1 with every block non-empty; block {b} is empty"),
            ));
        }
        let bounds = if labels.windows(2).all(|w| w[0] <= w[1]) {
            let mut bounds = mem::vec("the partition's blocks", m + 1)?;
            bounds.push(0);
            bounds.extend(labels.windows(2).enumerate().filter(|(_, w)| w[0] != w[1]).map(|(j, _)| j + 1));
            bounds.push(labels.len());
            Some(bounds)
        } else {
            None
        };
        Ok(Partition::Labels { labels, m, bounds })
    }

    /// [`Partition::labels`] from any integers (negative or too large labels are errors).
    pub fn from_ints(labels: &[i64]) -> Result<Self> {
        let mut v = mem::vec("the partition's labels", labels.len())?;
        for &l in labels {
            let l = u32::try_from(l).map_err(|_| CoreError::invalid("partition", format!("block labels must be in [0, 2**32), got {l}")))?;
            v.push(l);
        }
        Self::labels(v)
    }

    pub fn m(&self) -> usize {
        match self {
            Partition::Contiguous { m } => *m,
            Partition::Labels { m, .. } => *m,
        }
    }

    /// Checks that the partition is one of `0..d`.
    pub fn check(&self, d: usize) -> Result<()> {
        match self {
            Partition::Contiguous { m } if *m > d => Err(CoreError::invalid("m", format!("m = {m} blocks exceed d = {d} coordinates"))),
            Partition::Labels { labels, .. } if labels.len() != d => Err(CoreError::invalid(
                "partition",
                format!("labels {} coordinates but the input has d = {d}", labels.len()),
            )),
            _ => Ok(()),
        }
    }

    /// The boundaries of the blocks when every block is a range, else `None`.
    pub fn bounds(&self, d: usize) -> Result<Option<Vec<usize>>> {
        self.check(d)?;
        match self {
            Partition::Contiguous { m } => Ok(Some(mem::collect("the partition's blocks", m + 1, (0..=*m).map(|b| (b as u128 * d as u128 / *m as u128) as usize))?)),
            Partition::Labels { bounds, .. } => bounds.as_ref().map(|b| mem::copy("the partition's blocks", b)).transpose(),
        }
    }

    /// The blocks as CSR: `coords[offsets[b]..offsets[b + 1]]` is block `b`, increasing.
    pub fn csr(&self, d: usize) -> Result<(Vec<usize>, Vec<u32>)> {
        self.check(d)?;
        match self {
            Partition::Contiguous { m } => Ok((
                mem::collect("the partition's blocks", m + 1, (0..=*m).map(|b| (b as u128 * d as u128 / *m as u128) as usize))?,
                mem::collect("the partition's coordinates", d, 0..d as u32)?,
            )),
            Partition::Labels { labels, m, .. } => {
                let mut offsets = mem::filled("the partition's blocks", m + 1, 0usize)?;
                for &l in labels {
                    offsets[l as usize + 1] += 1;
                }
                for b in 0..*m {
                    offsets[b + 1] += offsets[b];
                }
                let mut fill = mem::copy("the partition's blocks", &offsets)?;
                let mut coords = mem::filled("the partition's coordinates", d, 0u32)?;
                for (j, &l) in labels.iter().enumerate() {
                    coords[fill[l as usize]] = j as u32;
                    fill[l as usize] += 1;
                }
                Ok((offsets, coords))
            }
        }
    }

    /// The blocks in the form the plans use: ranges when possible.
    pub fn blocks(&self, d: usize) -> Result<Blocks> {
        Ok(match self.bounds(d)? {
            Some(bounds) => Blocks::Ranges(bounds),
            None => {
                let (offsets, coords) = self.csr(d)?;
                Blocks::Listed { offsets, coords }
            }
        })
    }

    fn is_ranges(&self) -> bool {
        matches!(self, Partition::Contiguous { .. } | Partition::Labels { bounds: Some(_), .. })
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct BlockPermK {
    pub partition: Partition,
}

impl Sparsify for BlockPermK {
    const NAME: &'static str = "blockpermk";
    const TITLE: &'static str = "BlockPermK";
    const PARAMS: &'static [&'static str] = &["m", "labels"];

    fn from_params(params: &mut Params) -> Result<Self> {
        let m = params.take_count("m", 1)?;
        let labels = params.take_ints("labels")?;
        let partition = match (m, labels) {
            (m, Some(l)) => {
                let p = Partition::from_ints(&l)?;
                if let Some(m) = m.filter(|&m| m != p.m()) {
                    return Err(CoreError::invalid("m", format!("m = {m} but the labels have {} blocks", p.m())));
                }
                p
            }
            (Some(m), None) => Partition::Contiguous { m },
            (None, None) => return Err(CoreError::invalid("m", "blockpermk needs m or labels")),
        };
        Ok(BlockPermK { partition })
    }

    fn check(&self, n: usize, d: usize) -> Result<()> {
        let m = self.partition.m();
        if m > n {
            return Err(CoreError::invalid("m", format!("m = {m} blocks exceed n = {n} workers (need m <= n)")));
        }
        self.partition.check(d)
    }

    fn footprint(&self, n: usize, d: usize) -> Footprint {
        let m = self.partition.m();
        let max = match self.partition {
            Partition::Contiguous { m } => d.div_ceil(m.max(1)),
            _ => d,
        };
        Footprint::blocks(n, d, m, !self.partition.is_ranges(), max as u128)
    }

    fn assign<T: Real>(&self, n: usize, d: usize, seed: u64, round: u64, _data: Option<ArrayView2<T>>) -> Result<Assignment> {
        let blocks = self.partition.blocks(d)?;
        let pi = permutation(&mut rng::stream(seed, Purpose::Permutation, SHARED, round), n)?;
        Ok(Assignment::Plan(plan::block_plan(n, blocks, pi)?))
    }

    fn contiguous(&self, _n: usize, _d: usize) -> bool {
        self.partition.is_ranges()
    }

    fn ranges(&self, n: usize, d: usize, seed: u64, round: u64) -> Result<Option<Ranges>> {
        if !self.contiguous(n, d) {
            return Ok(None);
        }
        self.assign::<f64>(n, d, seed, round, None)?.block_ranges()
    }
}

/// The block permutation plan from an explicit permutation `pi` of the workers; `labels[j]`
/// is the block of coordinate `j` (PermK for `n > d` is `labels = range(d)`). Validated, as
/// numpy-ready arrays: the exact enumeration of the tests.
pub fn plan_from_permutation(labels: Vec<u32>, pi: Vec<u32>) -> Result<CsrArrays> {
    let d = labels.len();
    let n = pi.len();
    let sp = BlockPermK { partition: Partition::labels(labels)? };
    if n == 0 || n > u32::MAX as usize {
        return Err(CoreError::invalid("pi", format!("must be a permutation of range(n) with 1 <= n < 2**32, got {n} entries")));
    }
    if d > u32::MAX as usize {
        return Err(CoreError::invalid("labels", format!("must label fewer than 2**32 coordinates, got {d}")));
    }
    sp.check(n, d)?;
    plan::check_permutation(&pi, n, "pi")?;
    let blocks = sp.partition.blocks(d)?;
    plan::block_plan(n, blocks, pi)?.csr_arrays(d)
}
