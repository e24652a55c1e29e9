//! Arrays laid out over several devices: which part of a tensor each device holds
//! ([`ShardLayout`]), and uploading each device only its part. A part that is one contiguous
//! run of the host memory is shared with the device (zero-copy where the plugin allows); any
//! other part is gathered into aligned memory of its own first.
use std::sync::Arc;

use crate::error::{Error, Result};
use crate::host::{element_count, HostBytes, HostTensor};
use crate::{Buffer, Client, DType, Device};

/// How a tensor is split over a mesh of devices: the mesh's axis sizes (devices numbered
/// row-major, the last axis fastest) and, per tensor dimension, the axes it is split over,
/// major first. A dimension split over no axis is whole; axes no dimension names replicate.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    mesh: Vec<i64>,
    dims: Vec<Vec<usize>>,
}

impl ShardLayout {
    pub fn new(mesh: Vec<i64>, dims: Vec<Vec<usize>>) -> Result<ShardLayout> {
        let mut used = vec![false; mesh.len()];
        for &axis in dims.iter().flatten() {
            if axis >= mesh.len() || std::mem::replace(&mut used[axis], true) {
                return Err(Error::Invalid(format!(
                    "a layout over a mesh of {} axes names axis {axis} twice or beyond them",
                    mesh.len()
                )));
            }
        }
        if mesh.iter().any(|&s| s < 1) {
            return Err(Error::Invalid(format!(
                "mesh sizes must be positive: {mesh:?}"
            )));
        }
        Ok(ShardLayout { mesh, dims })
    }

    /// Whole on every device of `mesh`, for a tensor of `rank` dimensions.
    pub fn replicated(mesh: Vec<i64>, rank: usize) -> ShardLayout {
        ShardLayout {
            mesh,
            dims: vec![Vec::new(); rank],
        }
    }

    pub fn devices(&self) -> usize {
        self.mesh.iter().product::<i64>() as usize
    }

    /// Per tensor dimension, the mesh axes (by index) it is split over, major first.
    pub fn dims(&self) -> &[Vec<usize>] {
        &self.dims
    }

    pub fn is_replicated(&self) -> bool {
        self.dims.iter().all(Vec::is_empty)
    }

    /// Whether the device at `position` holds the first copy of its part: its coordinate is 0
    /// along every axis no dimension is split over (the others hold the same part again).
    pub fn first_copy(&self, position: usize) -> bool {
        let mut rest = position as i64;
        for (axis, &size) in self.mesh.iter().enumerate().rev() {
            let used = self.dims.iter().any(|axes| axes.contains(&axis));
            if !used && rest % size != 0 {
                return false;
            }
            rest /= size;
        }
        true
    }

    /// The shape of each device's part of a tensor of shape `global`.
    pub fn part_shape(&self, global: &[i64]) -> Result<Vec<i64>> {
        Ok(self
            .part(0, global)?
            .into_iter()
            .map(|(_, len)| len)
            .collect())
    }

    /// Per dimension, (first index, length) of the part the device at `position` (in mesh
    /// order) holds of a tensor of shape `global`.
    pub fn part(&self, position: usize, global: &[i64]) -> Result<Vec<(i64, i64)>> {
        if global.len() != self.dims.len() {
            return Err(Error::Invalid(format!(
                "a layout of {} dimensions for a tensor of shape {global:?}",
                self.dims.len()
            )));
        }
        // The device's coordinate along each mesh axis.
        let mut coords = vec![0i64; self.mesh.len()];
        let mut rest = position as i64;
        for (axis, &size) in self.mesh.iter().enumerate().rev() {
            coords[axis] = rest % size;
            rest /= size;
        }
        global
            .iter()
            .zip(&self.dims)
            .enumerate()
            .map(|(d, (&size, axes))| {
                let (mut index, mut parts) = (0, 1);
                for &axis in axes {
                    index = index * self.mesh[axis] + coords[axis];
                    parts *= self.mesh[axis];
                }
                if size < 0 {
                    return Err(Error::Invalid(format!(
                        "dimension {d} of a tensor of shape {global:?} is negative"
                    )));
                }
                // A dimension the parts do not divide is padded to a multiple of them, as XLA
                // lays it out: every part has the same length, the last ones hold padding.
                let len = (size + parts - 1) / parts;
                Ok((index * len, len))
            })
            .collect()
    }
}

/// Per dimension, how much of `part` (first index, length) holds elements of the tensor of
/// shape `global` rather than padding.
fn held(part: &[(i64, i64)], global: &[i64]) -> Vec<i64> {
    part.iter()
        .zip(global)
        .map(|(&(first, len), &size)| len.min(size - first).max(0))
        .collect()
}

/// Each innermost row of the elements a part holds (all of them, or all but its padding): (its
/// byte offset in the tensor's row-major bytes, its byte offset in the part's, its byte
/// length), in the part's row-major order.
fn held_rows(
    global: &[i64],
    part: &[(i64, i64)],
    elem: usize,
    mut row: impl FnMut(usize, usize, usize),
) {
    let held = held(part, global);
    if held.contains(&0) {
        return;
    }
    let rank = global.len();
    let (outer, run) = (&held[..rank - 1], held[rank - 1] as usize * elem);
    let part_dims: Vec<i64> = part.iter().map(|&(_, len)| len).collect();
    let (tensor_stride, local_stride) = (strides(global), strides(&part_dims));
    let mut index = vec![0i64; rank - 1];
    loop {
        let mut from = part[rank - 1].0 as usize * tensor_stride[rank - 1];
        let mut to = 0;
        for d in 0..rank - 1 {
            from += (part[d].0 + index[d]) as usize * tensor_stride[d];
            to += index[d] as usize * local_stride[d];
        }
        row(from * elem, to * elem, run);
        let Some(d) = (0..rank - 1).rev().find(|&d| index[d] + 1 < outer[d]) else {
            return;
        };
        index[d] += 1;
        index[d + 1..].iter_mut().for_each(|i| *i = 0);
    }
}

/// `len` bytes of `parent` from `offset`: a part of a tensor that is one contiguous run.
struct Slice {
    parent: Arc<dyn HostBytes>,
    offset: usize,
    len: usize,
}

impl HostBytes for Slice {
    fn bytes(&self) -> &[u8] {
        &self.parent.bytes()[self.offset..self.offset + self.len]
    }
}

/// Row-major strides, in elements.
fn strides(shape: &[i64]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1] as usize;
    }
    s
}

/// Where the part `part` of a tensor of shape `global` lies in the tensor's row-major bytes.
enum Region {
    /// The whole tensor.
    Whole,
    /// One contiguous run: (byte offset, byte length).
    Run(usize, usize),
    /// Several runs, one per innermost row (`held_rows`), or a part that ends in padding.
    Rows,
}

fn region(global: &[i64], part: &[(i64, i64)], elem: usize) -> Result<Region> {
    let part_dims: Vec<i64> = part.iter().map(|&(_, len)| len).collect();
    if held(part, global) != part_dims {
        return Ok(Region::Rows);
    }
    if part_dims == global {
        return Ok(Region::Whole);
    }
    // Contiguous when every dimension before the first split one has size 1 and every one
    // after it is whole.
    let first = part
        .iter()
        .zip(global)
        .position(|(&(_, len), &g)| len != g)
        .expect("a part that is not whole has a split dimension");
    let contiguous = global[..first].iter().all(|&g| g == 1)
        && part[first + 1..]
            .iter()
            .zip(&global[first + 1..])
            .all(|(&(_, len), &g)| len == g);
    if contiguous {
        let offset = part[first].0 as usize * strides(global)[first] * elem;
        return Ok(Region::Run(offset, element_count(&part_dims)? * elem));
    }
    Ok(Region::Rows)
}

/// The bytes of the part `part` of a tensor of shape `global` held in `data`.
fn part_bytes(
    data: &Arc<dyn HostBytes>,
    dtype: DType,
    global: &[i64],
    part: &[(i64, i64)],
) -> Result<Arc<dyn HostBytes>> {
    match region(global, part, dtype.byte_size())? {
        Region::Whole => Ok(data.clone()),
        Region::Run(offset, len) => Ok(Arc::new(Slice {
            parent: data.clone(),
            offset,
            len,
        })),
        Region::Rows => {
            // Gathered into aligned memory of its own; padding stays zero.
            let part_dims: Vec<i64> = part.iter().map(|&(_, len)| len).collect();
            let mut gathered = HostTensor::zeros(dtype, &part_dims)?;
            let (source, local) = (data.bytes(), gathered.bytes_mut());
            held_rows(global, part, dtype.byte_size(), |from, to, run| {
                local[to..to + run].copy_from_slice(&source[from..from + run]);
            });
            Ok(Arc::new(gathered))
        }
    }
}

impl Client {
    /// One buffer per device of `devices` (in mesh order) holding that device's part of the
    /// tensor of shape `global` in `data`, as `layout` says. Each device receives only its part.
    pub fn upload_sharded(
        &self,
        dtype: DType,
        global: &[i64],
        data: Arc<dyn HostBytes>,
        layout: &ShardLayout,
        devices: &[Device],
    ) -> Result<Vec<Buffer>> {
        if devices.len() != layout.devices() {
            return Err(Error::Invalid(format!(
                "a layout over {} devices for {} devices",
                layout.devices(),
                devices.len()
            )));
        }
        devices
            .iter()
            .enumerate()
            .map(|(position, device)| {
                let part = layout.part(position, global)?;
                let dims: Vec<i64> = part.iter().map(|&(_, len)| len).collect();
                let bytes = part_bytes(&data, dtype, global, &part)?;
                self.buffer_sharing(dtype, &dims, bytes, device)
            })
            .collect()
    }
}

/// Assembles the tensor of shape `global` whose parts `parts` (one buffer per device, in mesh
/// order) hold as `layout` says into `dst`, its row-major bytes: each part is read once (a
/// replicated part from the first device holding it), straight into place where it is one
/// contiguous run.
pub fn download_sharded(
    parts: &[&Buffer],
    layout: &ShardLayout,
    dtype: DType,
    global: &[i64],
    dst: &mut [u8],
) -> Result<()> {
    if parts.len() != layout.devices() {
        return Err(Error::Invalid(format!(
            "a layout over {} devices for the parts of {} devices",
            layout.devices(),
            parts.len()
        )));
    }
    let expected = element_count(global)? * dtype.byte_size();
    if dst.len() != expected {
        return Err(Error::Invalid(format!(
            "a tensor of shape {global:?} takes {expected} bytes, the destination has {}",
            dst.len()
        )));
    }
    for (position, buffer) in parts.iter().enumerate() {
        if !layout.first_copy(position) {
            continue;
        }
        let part = layout.part(position, global)?;
        match region(global, &part, dtype.byte_size())? {
            Region::Whole => return buffer.copy_to_host(dst),
            Region::Run(offset, len) => buffer.copy_to_host(&mut dst[offset..offset + len])?,
            Region::Rows => {
                // Each held row into place; padding is dropped.
                let dims: Vec<i64> = part.iter().map(|&(_, len)| len).collect();
                let mut local = HostTensor::zeros(dtype, &dims)?;
                buffer.copy_to_host(local.bytes_mut())?;
                let held = local.bytes();
                held_rows(global, &part, dtype.byte_size(), |to, from, run| {
                    dst[to..to + run].copy_from_slice(&held[from..from + run]);
                });
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 0, 1, 2, ... as u8s, shaped `dims`.
    fn counting(dims: &[i64]) -> Arc<dyn HostBytes> {
        let n = dims.iter().product::<i64>() as usize;
        Arc::new((0..n).map(|i| i as u8).collect::<Vec<u8>>())
    }

    fn part(layout: &ShardLayout, position: usize, dims: &[i64]) -> Vec<u8> {
        let p = layout.part(position, dims).unwrap();
        part_bytes(&counting(dims), DType::U8, dims, &p)
            .unwrap()
            .bytes()
            .to_vec()
    }

    #[test]
    fn each_device_holds_its_part() {
        // A 2x2 mesh; a [4, 2] tensor split by rows over axis 0, whole over axis 1.
        let rows = ShardLayout::new(vec![2, 2], vec![vec![0], vec![]]).unwrap();
        assert_eq!(rows.part(0, &[4, 2]).unwrap(), [(0, 2), (0, 2)]);
        assert_eq!(rows.part(1, &[4, 2]).unwrap(), [(0, 2), (0, 2)]);
        assert_eq!(rows.part(2, &[4, 2]).unwrap(), [(2, 2), (0, 2)]);
        assert_eq!(part(&rows, 3, &[4, 2]), [4, 5, 6, 7]);
        // Columns over axis 1: not contiguous, gathered.
        let cols = ShardLayout::new(vec![2, 2], vec![vec![], vec![1]]).unwrap();
        assert_eq!(part(&cols, 1, &[2, 4]), [2, 3, 6, 7]);
        assert_eq!(part(&cols, 2, &[2, 4]), [0, 1, 4, 5]);
        // Both axes on one dimension, major first: device (1, 0) holds the third quarter.
        let both = ShardLayout::new(vec![2, 2], vec![vec![0, 1]]).unwrap();
        assert_eq!(part(&both, 2, &[8]), [4, 5]);
        // Three dimensions, the middle one split.
        let mid = ShardLayout::new(vec![2], vec![vec![], vec![0], vec![]]).unwrap();
        assert_eq!(part(&mid, 1, &[2, 4, 2]), [4, 5, 6, 7, 12, 13, 14, 15]);
        assert_eq!(mid.part_shape(&[2, 4, 2]).unwrap(), [2, 2, 2]);
    }

    #[test]
    fn layouts_that_do_not_fit_are_errors() {
        assert!(ShardLayout::new(vec![2], vec![vec![0], vec![0]]).is_err());
        assert!(ShardLayout::new(vec![2], vec![vec![1]]).is_err());
        let rows = ShardLayout::new(vec![4], vec![vec![0]]).unwrap();
        assert!(rows.part(0, &[4, 4]).is_err());
    }

    #[test]
    fn dimensions_the_parts_do_not_divide_are_padded() {
        // 5 rows over 2 devices: parts of 3 rows, the second holding 2 and a row of padding.
        let rows = ShardLayout::new(vec![2], vec![vec![0], vec![]]).unwrap();
        assert_eq!(rows.part(1, &[5, 2]).unwrap(), [(3, 3), (0, 2)]);
        assert_eq!(rows.part_shape(&[5, 2]).unwrap(), [3, 2]);
        assert_eq!(part(&rows, 0, &[5, 2]), [0, 1, 2, 3, 4, 5]);
        assert_eq!(part(&rows, 1, &[5, 2]), [6, 7, 8, 9, 0, 0]);
        // Columns: 3 over 2 devices, padded inside each row.
        let cols = ShardLayout::new(vec![2], vec![vec![], vec![0]]).unwrap();
        assert_eq!(part(&cols, 1, &[2, 3]), [2, 0, 5, 0]);
        // 1 row over 4 devices: the last three hold only padding.
        let many = ShardLayout::new(vec![4], vec![vec![0]]).unwrap();
        assert_eq!(part(&many, 3, &[1]), [0]);
        // And back: every held element in place, the padding dropped.
        let mut back = vec![0u8; 10];
        let data = counting(&[5, 2]);
        let parts: Vec<Vec<u8>> = (0..2).map(|p| part(&rows, p, &[5, 2])).collect();
        for (p, local) in parts.iter().enumerate() {
            let at = rows.part(p, &[5, 2]).unwrap();
            held_rows(&[5, 2], &at, 1, |to, from, run| {
                back[to..to + run].copy_from_slice(&local[from..from + run]);
            });
        }
        assert_eq!(back, data.bytes());
    }
}
