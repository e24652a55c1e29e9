//! Tensors in numpy's `.npy` and `.npz` files, and comparisons with reference tensors read
//! from them ([`compare`]).
//!
//! numpy has no bfloat16: bfloat16 tensors are written widened to float32, and a float32 array
//! is accepted for a bfloat16 input (rounded to nearest even).
use anyhow::{bail, Context, Result};
use npyz::{Endianness, NpyFile, Order, TypeChar, WriterBuilder};
use std::io::{Read, Seek};
use std::path::Path;
use tpuc_dtype::{DType, Kind};
use tpuc_pjrt::HostTensor;

pub mod compare;

/// Reads one array from a `.npy` file.
pub fn read_npy(path: &Path) -> Result<HostTensor> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    read_npy_from(std::io::BufReader::new(file))
        .with_context(|| format!("cannot read {}", path.display()))
}

/// Reads the arrays `arr_0`, `arr_1`, ... of a `.npz` file (as `np.savez(f, *arrays)` writes).
pub fn read_npz(path: &Path) -> Result<Vec<HostTensor>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
    read_npz_from(file).with_context(|| format!("cannot read {}", path.display()))
}

/// [`read_npz`] of the `.npz` bytes `reader` gives.
pub fn read_npz_from(reader: impl Read + Seek) -> Result<Vec<HostTensor>> {
    let mut archive = zip::ZipArchive::new(reader)?;
    let mut arrays = Vec::new();
    for index in 0.. {
        let name = format!("arr_{index}.npy");
        let entry = match archive.by_name(&name) {
            Ok(entry) => entry,
            Err(zip::result::ZipError::FileNotFound) => break,
            Err(e) => return Err(e.into()),
        };
        arrays.push(read_npy_from(entry).with_context(|| name.clone())?);
    }
    if arrays.is_empty() && !archive.is_empty() {
        bail!("no arrays named arr_0, arr_1, ...");
    }
    Ok(arrays)
}

/// Reads one array from the `.npy` bytes `reader` gives.
pub fn read_npy_from(reader: impl Read) -> Result<HostTensor> {
    let npy = NpyFile::new(checked_header(reader)?).context("not a .npy array")?;
    let npyz::DType::Plain(type_str) = npy.dtype() else {
        bail!("structured arrays are not supported");
    };
    let fortran = npy.order() == Order::Fortran;
    if type_str.endianness() == Endianness::Big && type_str.size_field() > 1 {
        bail!("big-endian arrays are not supported ({type_str})");
    }
    let kind = match type_str.type_char() {
        TypeChar::Bool => Some(Kind::Bool),
        TypeChar::Int => Some(Kind::Signed),
        TypeChar::Uint => Some(Kind::Unsigned),
        TypeChar::Float => Some(Kind::Float),
        TypeChar::Complex => Some(Kind::Complex),
        _ => None,
    };
    let Some(element_type) = kind.and_then(|k| DType::from_kind(k, type_str.size_field() as usize))
    else {
        bail!("arrays of dtype {type_str} are not supported");
    };
    let dims: Vec<i64> = npy
        .shape()
        .iter()
        .map(|&d| i64::try_from(d))
        .collect::<std::result::Result<_, _>>()
        .context("the array's shape is out of range")?;
    let expected = npy
        .shape()
        .iter()
        .try_fold(element_type.byte_size() as u64, |n, &d| n.checked_mul(d))
        .context("the array's shape is out of range")?;
    // Read as far as the data goes (a header's shape alone allocates nothing): memory follows
    // the file's size, not what its header claims.
    let mut bytes = Vec::new();
    npy.into_inner()
        .take(expected.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if (bytes.len() as u64) < expected {
        bail!("the array's data is shorter than its shape {dims:?}");
    }
    if bytes.len() as u64 > expected {
        bail!("the array has more data than its shape {dims:?} holds");
    }
    let mut tensor = HostTensor::from_bytes(element_type, &dims, &bytes)?;
    if fortran {
        let row_major = fortran_to_row_major(tensor.bytes(), &dims, element_type.byte_size());
        tensor.bytes_mut().copy_from_slice(&row_major);
    }
    Ok(tensor)
}

/// Reorders column-major (Fortran) data of shape `dims` into row-major order.
/// The longest header read (numpy writes a few dozen bytes; version 1 allows 64 KiB).
const MAX_HEADER: usize = 1 << 20;
/// The deepest nesting of brackets a header may have (numpy's: a dict holding a tuple).
const MAX_HEADER_DEPTH: usize = 4;

/// `reader`, its header checked before npyz parses it: the Python-literal parser npyz uses
/// takes time exponential in the nesting of brackets (a 200-byte header of `[[[[...` did not
/// finish in 15 s), so a header nested deeper than numpy's, or longer than any it writes, is an
/// error here.
fn checked_header(mut reader: impl Read) -> Result<impl Read> {
    let mut preamble = [0u8; 8];
    reader
        .read_exact(&mut preamble)
        .context("not a .npy array (shorter than its preamble)")?;
    if &preamble[..6] != b"\x93NUMPY" {
        bail!("not a .npy array (no \\x93NUMPY magic)");
    }
    let mut length = vec![0u8; if preamble[6] == 1 { 2 } else { 4 }];
    reader
        .read_exact(&mut length)
        .context("not a .npy array (its header's length is cut short)")?;
    let header_len = length
        .iter()
        .rev()
        .fold(0usize, |n, &b| (n << 8) | usize::from(b));
    if header_len > MAX_HEADER {
        bail!("the .npy header is {header_len} bytes long (at most {MAX_HEADER} are read)");
    }
    let mut header = vec![0u8; header_len];
    reader
        .read_exact(&mut header)
        .context("the .npy header is cut short")?;
    let (mut depth, mut deepest) = (0usize, 0usize);
    for &byte in &header {
        match byte {
            b'(' | b'[' | b'{' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    if deepest > MAX_HEADER_DEPTH {
        bail!("the .npy header nests brackets {deepest} deep: not a header numpy writes");
    }
    Ok(std::io::Cursor::new([&preamble[..], &length, &header].concat()).chain(reader))
}

fn fortran_to_row_major(data: &[u8], dims: &[i64], element_size: usize) -> Vec<u8> {
    let dims: Vec<usize> = dims.iter().map(|&d| d as usize).collect();
    // Column-major strides, in elements.
    let mut strides = vec![1usize; dims.len()];
    for axis in 1..dims.len() {
        strides[axis] = strides[axis - 1] * dims[axis - 1];
    }
    let mut out = Vec::with_capacity(data.len());
    let mut index = vec![0usize; dims.len()];
    for _ in 0..data.len() / element_size.max(1) {
        let offset: usize = index
            .iter()
            .zip(&strides)
            .map(|(i, s)| i * s)
            .sum::<usize>()
            * element_size;
        out.extend_from_slice(&data[offset..offset + element_size]);
        // Advance the row-major index, last axis fastest.
        for axis in (0..dims.len()).rev() {
            index[axis] += 1;
            if index[axis] < dims[axis] {
                break;
            }
            index[axis] = 0;
        }
    }
    out
}

/// `tensor` converted to `element_type` where the conversion is one numpy cannot express
/// (float32 given for bfloat16 or an 8-bit float); otherwise `None`.
pub fn adapt_to(tensor: &HostTensor, element_type: DType) -> Result<Option<HostTensor>> {
    if tensor.element_type() == DType::F32
        && matches!(element_type, DType::F8E4M3FN | DType::F8E5M2)
    {
        let bytes: Vec<u8> = tensor
            .to_vec::<f32>()?
            .into_iter()
            .map(|x| tpuc_dtype::f8_bits(element_type, f64::from(x)))
            .collect();
        return Ok(Some(HostTensor::from_bytes(
            element_type,
            tensor.dims(),
            &bytes,
        )?));
    }
    if tensor.element_type() == DType::F32 && element_type == DType::BF16 {
        let values: Vec<u16> = tensor
            .to_vec::<f32>()?
            .into_iter()
            .map(|x| half::bf16::from_f32(x).to_bits())
            .collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        return Ok(Some(HostTensor::from_bytes(
            element_type,
            tensor.dims(),
            &bytes,
        )?));
    }
    Ok(None)
}

/// `tensors` given for inputs of `element_types` (in order), each converted where numpy could
/// not express its type ([`adapt_to`]); tensors beyond the types are left as they are.
pub fn adapt_all(tensors: Vec<HostTensor>, element_types: &[DType]) -> Result<Vec<HostTensor>> {
    tensors
        .into_iter()
        .enumerate()
        .map(|(i, tensor)| match element_types.get(i) {
            Some(&dtype) => Ok(adapt_to(&tensor, dtype)?.unwrap_or(tensor)),
            None => Ok(tensor),
        })
        .collect()
}

/// Writes `tensor` as a `.npy` file (bfloat16 and 8-bit floats widened to float32).
pub fn write_npy(path: &Path, tensor: &HostTensor) -> Result<()> {
    let file =
        std::fs::File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut out = std::io::BufWriter::new(file);
    let shape: Vec<u64> = tensor.dims().iter().map(|&d| d as u64).collect();
    macro_rules! write_as {
        ($t:ty, $values:expr) => {{
            let mut writer = npyz::WriteOptions::<$t>::new()
                .default_dtype()
                .shape(&shape)
                .writer(&mut out)
                .begin_nd()?;
            writer.extend($values)?;
            writer.finish()?;
        }};
    }
    match tensor.element_type() {
        DType::Bool => write_as!(bool, tensor.to_vec::<bool>()?),
        DType::I8 => write_as!(i8, tensor.to_vec::<i8>()?),
        DType::I16 => write_as!(i16, tensor.to_vec::<i16>()?),
        DType::I32 => write_as!(i32, tensor.to_vec::<i32>()?),
        DType::I64 => write_as!(i64, tensor.to_vec::<i64>()?),
        DType::U8 => write_as!(u8, tensor.to_vec::<u8>()?),
        DType::U16 => write_as!(u16, tensor.to_vec::<u16>()?),
        DType::U32 => write_as!(u32, tensor.to_vec::<u32>()?),
        DType::U64 => write_as!(u64, tensor.to_vec::<u64>()?),
        DType::F16 => write_as!(half::f16, halves(tensor).map(half::f16::from_bits)),
        DType::BF16 => write_as!(
            f32,
            halves(tensor).map(|b| half::bf16::from_bits(b).to_f32())
        ),
        DType::F32 => write_as!(f32, tensor.to_vec::<f32>()?),
        DType::F64 => write_as!(f64, tensor.to_vec::<f64>()?),
        DType::F8E4M3FN | DType::F8E5M2 => {
            write_as!(f32, eight_bit_floats(tensor)?.map(|v| v as f32))
        }
        DType::C64 => write_as!(
            npyz::num_complex::Complex32,
            complex_parts(tensor)
                .chunks_exact(2)
                .map(|p| npyz::num_complex::Complex32::new(p[0] as f32, p[1] as f32))
        ),
        DType::C128 => write_as!(
            npyz::num_complex::Complex64,
            complex_parts(tensor)
                .chunks_exact(2)
                .map(|p| npyz::num_complex::Complex64::new(p[0], p[1]))
        ),
    }
    use std::io::Write;
    out.flush()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// The elements of a 16-bit tensor as their bit patterns.
fn halves(tensor: &HostTensor) -> impl Iterator<Item = u16> + '_ {
    tensor
        .bytes()
        .chunks_exact(2)
        .map(|c| u16::from_le_bytes([c[0], c[1]]))
}

/// The real and imaginary parts of a complex tensor's elements, interleaved (exact in f64).
fn complex_parts(tensor: &HostTensor) -> Vec<f64> {
    if tensor.element_type() == DType::C64 {
        tensor
            .bytes()
            .chunks_exact(4)
            .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
            .collect()
    } else {
        tensor
            .bytes()
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8-byte chunk")))
            .collect()
    }
}

/// Values of a tensor as f64, for comparisons (bfloat16 and float16 widened; a complex
/// element as its real and imaginary parts, in that order).
pub fn to_f64(tensor: &HostTensor) -> Result<Vec<f64>> {
    Ok(match tensor.element_type() {
        DType::Bool => tensor
            .to_vec::<bool>()?
            .into_iter()
            .map(|b| b as u8 as f64)
            .collect(),
        DType::I8 => tensor.to_vec::<i8>()?.into_iter().map(f64::from).collect(),
        DType::I16 => tensor.to_vec::<i16>()?.into_iter().map(f64::from).collect(),
        DType::I32 => tensor.to_vec::<i32>()?.into_iter().map(f64::from).collect(),
        DType::I64 => tensor
            .to_vec::<i64>()?
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        DType::U8 => tensor.to_vec::<u8>()?.into_iter().map(f64::from).collect(),
        DType::U16 => tensor.to_vec::<u16>()?.into_iter().map(f64::from).collect(),
        DType::U32 => tensor.to_vec::<u32>()?.into_iter().map(f64::from).collect(),
        DType::U64 => tensor
            .to_vec::<u64>()?
            .into_iter()
            .map(|v| v as f64)
            .collect(),
        DType::F16 => halves(tensor)
            .map(|b| half::f16::from_bits(b).to_f64())
            .collect(),
        DType::BF16 => halves(tensor)
            .map(|b| half::bf16::from_bits(b).to_f64())
            .collect(),
        DType::F32 => tensor.to_vec::<f32>()?.into_iter().map(f64::from).collect(),
        DType::F64 => tensor.to_vec::<f64>()?,
        DType::C64 | DType::C128 => complex_parts(tensor),
        DType::F8E4M3FN | DType::F8E5M2 => eight_bit_floats(tensor)?.collect(),
    })
}

/// The values of an 8-bit float tensor.
fn eight_bit_floats(tensor: &HostTensor) -> Result<std::vec::IntoIter<f64>> {
    let elem = tensor.element_type();
    let values: Vec<f64> = tensor
        .bytes()
        .iter()
        .map(|&b| tpuc_dtype::f8_value(elem, b))
        .collect();
    Ok(values.into_iter())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element type survives a .npy round trip; bfloat16 comes back widened to float32;
    /// a corrupt file is an error naming it.
    #[test]
    fn every_element_type_survives_a_round_trip() -> Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("t.npy");
        let cases = [
            HostTensor::from_slice(DType::F32, &[2, 2], &[1.5f32, -0.0, f32::NAN, 3e38])?,
            HostTensor::from_slice(DType::F64, &[3], &[1.0f64, -2.5, 1e-300])?,
            HostTensor::from_slice(DType::I64, &[2], &[i64::MIN, 7])?,
            HostTensor::from_slice(DType::I32, &[1, 2], &[-1i32, 2])?,
            HostTensor::from_slice(DType::I8, &[2], &[-128i8, 127])?,
            HostTensor::from_slice(DType::U8, &[2], &[0u8, 255])?,
            HostTensor::from_slice(DType::Bool, &[3], &[true, false, true])?,
            HostTensor::from_bytes(DType::F16, &[2], &[0x00, 0x3c, 0x00, 0xc0])?,
            HostTensor::zeros(DType::F32, &[0, 3])?,
            HostTensor::from_slice(DType::F32, &[], &[2.5f32])?,
        ];
        for tensor in &cases {
            write_npy(&path, tensor)?;
            let back = read_npy(&path)?;
            assert_eq!(back.element_type(), tensor.element_type());
            assert_eq!(back.dims(), tensor.dims());
            assert_eq!(back.bytes(), tensor.bytes(), "{tensor:?}");
        }
        let bf16 = HostTensor::from_bytes(DType::BF16, &[2], &[0x80, 0x3f, 0x00, 0xc0])?;
        write_npy(&path, &bf16)?;
        assert_eq!(read_npy(&path)?.to_vec::<f32>()?, vec![1.0, -2.0]);
        std::fs::write(&path, b"\x93NUMPY garbage")?;
        let error = read_npy(&path).expect_err("a corrupt file");
        assert!(format!("{error:#}").contains("t.npy"), "{error:#}");
        Ok(())
    }

    #[test]
    fn float32_given_for_bfloat16_inputs_is_converted() -> Result<()> {
        let given = vec![
            HostTensor::from_slice(DType::F32, &[2], &[1.0f32, -2.0])?,
            HostTensor::from_slice(DType::F32, &[1], &[3.0f32])?,
        ];
        let adapted = adapt_all(given, &[DType::BF16, DType::F32])?;
        assert_eq!(adapted[0].element_type(), DType::BF16);
        assert_eq!(adapted[0].bytes(), &[0x80, 0x3f, 0x00, 0xc0]);
        assert_eq!(adapted[1].element_type(), DType::F32);
        Ok(())
    }
}
