//! How a compiled program lays a value out over its devices, as XLA states it (an `OpSharding`
//! proto from the plugin's shardings extension): read into [`Tiling`], and matched with the mesh
//! layouts tpuc speaks ([`ShardLayout::from_tiling`]).
use crate::error::{Error, Result};
use crate::proto::{op_sharding::Type, OpSharding};
use crate::sharded::ShardLayout;
use prost::Message;

/// One value's layout over the devices (partitions) of an SPMD program.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Tiling {
    /// Whole on every device.
    Replicated,
    /// Split into `tiles[d]` parts along each dimension `d`, each part held by `copies`
    /// devices: `devices` lists the device of each (part, copy), parts row-major over `tiles`,
    /// copies fastest.
    Tiled {
        tiles: Vec<i64>,
        copies: i64,
        devices: Vec<i64>,
    },
    /// A form tpuc does not read, by name (one device's, manual, a tuple, unreduced copies).
    Other(String),
}

impl Tiling {
    /// The tiling a serialized `xla.OpSharding` states.
    pub fn decode(bytes: &[u8]) -> Result<Tiling> {
        let proto = OpSharding::decode(bytes)
            .map_err(|e| Error::Invalid(format!("an output sharding the plugin gave: {e}")))?;
        Ok(Tiling::from_proto(&proto))
    }

    fn from_proto(proto: &OpSharding) -> Tiling {
        let kind = proto.r#type();
        match kind {
            Type::Replicated => return Tiling::Replicated,
            Type::Other => {}
            other => return Tiling::Other(format!("{other:?}").to_lowercase()),
        }
        let mut tiles = proto.tile_assignment_dimensions.clone();
        let grouped = proto
            .last_tile_dims
            .iter()
            .any(|&t| t != Type::Replicated as i32);
        if grouped {
            return Tiling::Other("grouped (manual or unreduced) copies".into());
        }
        // The trailing dimensions beyond the value's are its copies.
        let trailing =
            usize::from(proto.replicate_on_last_tile_dim).max(proto.last_tile_dims.len());
        let copies: i64 = tiles
            .split_off(tiles.len().saturating_sub(trailing))
            .iter()
            .product();
        let count: i64 = tiles.iter().product::<i64>() * copies;
        let devices = if proto.iota_reshape_dims.is_empty() {
            proto.tile_assignment_devices.clone()
        } else {
            iota_devices(&proto.iota_reshape_dims, &proto.iota_transpose_perm)
        };
        if count < 1 || devices.len() as i64 != count {
            return Tiling::Other(format!(
                "{} devices for {count} tiles and copies",
                devices.len()
            ));
        }
        Tiling::Tiled {
            tiles,
            copies,
            devices,
        }
    }
}

/// The devices `0..product(dims)` arranged as `dims`, transposed by `perm`, in row-major order:
/// XLA's compact ("iota") form of a tile assignment.
fn iota_devices(dims: &[i64], perm: &[i32]) -> Vec<i64> {
    let perm: Vec<usize> = if perm.len() == dims.len() {
        perm.iter().map(|&p| p as usize).collect()
    } else {
        (0..dims.len()).collect()
    };
    let shape: Vec<i64> = perm.iter().map(|&p| dims[p]).collect();
    let count: i64 = dims.iter().product();
    (0..count)
        .map(|linear| {
            // The position in the transposed array, then the device at it in the original.
            let mut rest = linear;
            let mut index = vec![0i64; dims.len()];
            for k in (0..shape.len()).rev() {
                index[perm[k]] = rest % shape[k];
                rest /= shape[k];
            }
            index.iter().zip(dims).fold(0, |acc, (&i, &d)| acc * d + i)
        })
        .collect()
}

impl ShardLayout {
    /// The layout over a mesh of axis sizes `mesh` (devices numbered row-major, device d the
    /// program's partition d) that places a value of `rank` dimensions as `tiling` does; None
    /// when no assignment of whole mesh axes to dimensions does (XLA may split an axis).
    pub fn from_tiling(mesh: &[i64], rank: usize, tiling: &Tiling) -> Option<ShardLayout> {
        let devices: i64 = mesh.iter().product();
        let (tiles, copies, order) = match tiling {
            Tiling::Replicated => return Some(ShardLayout::replicated(mesh.to_vec(), rank)),
            Tiling::Other(_) => return None,
            Tiling::Tiled {
                tiles,
                copies,
                devices,
            } => (tiles, *copies, devices),
        };
        if tiles.len() != rank || tiles.iter().product::<i64>() * copies != devices {
            return None;
        }
        // The part each device holds, as tile coordinates (a tensor of shape `tiles` split
        // into parts of one).
        let mut wanted = vec![Vec::new(); order.len()];
        for (slot, &device) in order.iter().enumerate() {
            let device = usize::try_from(device).ok().filter(|&d| d < order.len())?;
            let mut part = (slot as i64) / copies;
            let mut coords = vec![0i64; rank];
            for d in (0..rank).rev() {
                coords[d] = part % tiles[d];
                part /= tiles[d];
            }
            wanted[device] = coords;
        }
        candidates(mesh.len(), rank).into_iter().find_map(|dims| {
            let layout = ShardLayout::new(mesh.to_vec(), dims).ok()?;
            (0..order.len())
                .all(|device| match layout.part(device, tiles) {
                    Ok(part) => {
                        part.iter()
                            .map(|&(first, _)| first)
                            .eq(wanted[device].iter().copied())
                            && part.iter().all(|&(_, len)| len == 1)
                    }
                    Err(_) => false,
                })
                .then_some(layout)
        })
    }
}

/// Every way to give each of `axes` mesh axes to one of `rank` dimensions or to none, with the
/// axes of a dimension in every order.
fn candidates(axes: usize, rank: usize) -> Vec<Vec<Vec<usize>>> {
    let mut found = vec![vec![Vec::new(); rank]];
    for axis in 0..axes {
        let mut next = Vec::new();
        for dims in &found {
            // The axis replicates the value...
            next.push(dims.clone());
            // ...or splits a dimension, at any place among the axes already there.
            for d in 0..rank {
                for at in 0..=dims[d].len() {
                    let mut with = dims.clone();
                    with[d].insert(at, axis);
                    next.push(with);
                }
            }
        }
        found = next;
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiled(tiles: &[i64], copies: i64, devices: &[i64]) -> Tiling {
        Tiling::Tiled {
            tiles: tiles.to_vec(),
            copies,
            devices: devices.to_vec(),
        }
    }

    #[test]
    fn iota_tile_assignments_list_their_devices() {
        assert_eq!(iota_devices(&[4], &[]), vec![0, 1, 2, 3]);
        // [[0, 1], [2, 3]] transposed.
        assert_eq!(iota_devices(&[2, 2], &[1, 0]), vec![0, 2, 1, 3]);
        assert_eq!(iota_devices(&[2, 3], &[1, 0]), vec![0, 3, 1, 4, 2, 5]);
    }

    #[test]
    fn protos_read_as_tilings() {
        let proto = OpSharding {
            r#type: Type::Other as i32,
            tile_assignment_dimensions: vec![2, 1, 2],
            replicate_on_last_tile_dim: true,
            iota_reshape_dims: vec![2, 2],
            iota_transpose_perm: vec![1, 0],
            ..OpSharding::default()
        };
        let tiling = Tiling::decode(&proto.encode_to_vec()).unwrap();
        assert_eq!(tiling, tiled(&[2, 1], 2, &[0, 2, 1, 3]));
        assert_eq!(
            Tiling::decode(&OpSharding::default().encode_to_vec()).unwrap(),
            Tiling::Replicated
        );
        let manual = OpSharding {
            r#type: Type::Manual as i32,
            ..OpSharding::default()
        };
        assert_eq!(
            Tiling::decode(&manual.encode_to_vec()).unwrap(),
            Tiling::Other("manual".into())
        );
        assert!(Tiling::decode(b"\xff\xff").is_err());
    }

    #[test]
    fn tilings_match_the_mesh_layout_that_places_them() {
        // Mesh fsdp=2, tp=2. Dimension 0 over tp, copies over fsdp: devices 0 and 2 hold the
        // first half.
        let layout = ShardLayout::from_tiling(&[2, 2], 2, &tiled(&[2, 1], 2, &[0, 2, 1, 3]));
        assert_eq!(
            layout,
            ShardLayout::new(vec![2, 2], vec![vec![1], vec![]]).ok()
        );
        // Dimension 1 over (tp, fsdp), tp major.
        let layout = ShardLayout::from_tiling(&[2, 2], 2, &tiled(&[1, 4], 1, &[0, 2, 1, 3]));
        assert_eq!(
            layout,
            ShardLayout::new(vec![2, 2], vec![vec![], vec![1, 0]]).ok()
        );
        // Both dimensions, one axis each.
        let layout = ShardLayout::from_tiling(&[2, 2], 2, &tiled(&[2, 2], 1, &[0, 1, 2, 3]));
        assert_eq!(
            layout,
            ShardLayout::new(vec![2, 2], vec![vec![0], vec![1]]).ok()
        );
        assert_eq!(
            ShardLayout::from_tiling(&[4], 1, &Tiling::Replicated),
            Some(ShardLayout::replicated(vec![4], 1))
        );
        // A part of an axis (two tiles over a mesh axis of 4) is no whole-axis layout.
        assert_eq!(
            ShardLayout::from_tiling(&[4], 1, &tiled(&[2], 2, &[0, 1, 2, 3])),
            None
        );
        // Tiles for another rank, or another device count.
        assert_eq!(
            ShardLayout::from_tiling(&[4], 2, &tiled(&[4], 1, &[0, 1, 2, 3])),
            None
        );
        assert_eq!(
            ShardLayout::from_tiling(&[2], 1, &tiled(&[4], 1, &[0, 1, 2, 3])),
            None
        );
    }
}
