//! User kernels: StableHLO written outside tpuc (a JAX function registered with `tpuc.jax_op`)
//! for one custom op at one signature. A program carries the kernels its custom op calls need:
//! the backend's program JSON under `tpuc_kernels`, a `.pt2` archive in its extra file
//! `tpuc_kernels.json` (`tpuc.save_kernels`), a `.fx` file in its `kernels` field. All three hold
//! the same document, [`KernelsDocument`].

use serde::{Deserialize, Serialize};

use crate::dtype::DType;

/// The name of the archive's extra file (`<archive>/extra/tpuc_kernels.json`).
pub const ARCHIVE_ENTRY: &str = "extra/tpuc_kernels.json";
/// The version of [`KernelsDocument`] this reader knows.
pub const FORMAT: u32 = 1;

/// A tensor a kernel takes or returns.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelTensor {
    pub dtype: DType,
    pub shape: Vec<i64>,
}

impl KernelTensor {
    pub fn describe(&self) -> String {
        let dims: Vec<String> = self.shape.iter().map(i64::to_string).collect();
        format!("{}[{}]", self.dtype, dims.join(", "))
    }
}

/// One op's kernel for one signature: `mlir` is a module in MLIR's generic form whose public
/// `main` takes the inputs at `operands` (a kernel may leave inputs unused, and JAX drops them)
/// and returns `outputs`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Kernel {
    /// The op as graphs name it: `mylib.scale.default`.
    pub op: String,
    pub inputs: Vec<KernelTensor>,
    pub outputs: Vec<KernelTensor>,
    pub operands: Vec<usize>,
    pub mlir: String,
    /// The StableHLO version the module was written for (the plugin's, when it was made).
    pub stablehlo_version: String,
}

impl Kernel {
    /// `mylib.scale.default(float32[4, 8], float32[8])`.
    pub fn describe(&self) -> String {
        let inputs: Vec<String> = self.inputs.iter().map(KernelTensor::describe).collect();
        format!("{}({})", self.op, inputs.join(", "))
    }

    /// What is wrong with the kernel, if anything.
    fn check(&self) -> Result<(), String> {
        if self.op.is_empty() {
            return Err("a kernel without an op name".into());
        }
        for t in self.inputs.iter().chain(&self.outputs) {
            if let Some(d) = t.shape.iter().find(|&&d| d < 0) {
                return Err(format!("{}: negative size {d}", self.describe()));
            }
        }
        if self.outputs.is_empty() {
            return Err(format!("{}: returns nothing", self.describe()));
        }
        if !self.operands.windows(2).all(|w| w[0] < w[1])
            || self.operands.iter().any(|&i| i >= self.inputs.len())
        {
            return Err(format!(
                "{}: operands {:?} are not increasing positions among its {} inputs",
                self.describe(),
                self.operands,
                self.inputs.len()
            ));
        }
        if self.mlir.trim().is_empty() {
            return Err(format!("{}: no module", self.describe()));
        }
        Ok(())
    }
}

/// Checks a program's kernels: each well formed, no op given two kernels for one signature.
pub fn check(kernels: &[Kernel]) -> Result<(), String> {
    for (i, k) in kernels.iter().enumerate() {
        k.check()?;
        if kernels[..i]
            .iter()
            .any(|o| o.op == k.op && o.inputs == k.inputs)
        {
            return Err(format!("two kernels for {}", k.describe()));
        }
    }
    Ok(())
}

/// The JSON document of a program's kernels.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelsDocument {
    pub format: u32,
    pub kernels: Vec<KernelJson>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KernelJson {
    pub op: String,
    pub inputs: Vec<TensorJson>,
    pub outputs: Vec<TensorJson>,
    pub operands: Vec<usize>,
    pub mlir: String,
    pub stablehlo_version: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TensorJson {
    pub dtype: String,
    pub shape: Vec<i64>,
}

impl KernelsDocument {
    /// The kernels it holds, or what is wrong with it.
    pub fn kernels(self) -> Result<Vec<Kernel>, String> {
        if self.format != FORMAT {
            return Err(format!(
                "kernels of format {}; this tpuc reads format {FORMAT}",
                self.format
            ));
        }
        let tensors = |ts: Vec<TensorJson>, op: &str| {
            ts.into_iter()
                .map(|t| {
                    let dtype = DType::from_name(&t.dtype)
                        .ok_or_else(|| format!("kernel of {op}: unknown dtype {:?}", t.dtype))?;
                    Ok(KernelTensor {
                        dtype,
                        shape: t.shape,
                    })
                })
                .collect::<Result<Vec<_>, String>>()
        };
        let kernels = self
            .kernels
            .into_iter()
            .map(|k| {
                Ok(Kernel {
                    inputs: tensors(k.inputs, &k.op)?,
                    outputs: tensors(k.outputs, &k.op)?,
                    op: k.op,
                    operands: k.operands,
                    mlir: k.mlir,
                    stablehlo_version: k.stablehlo_version,
                })
            })
            .collect::<Result<Vec<_>, String>>()?;
        check(&kernels)?;
        Ok(kernels)
    }

    /// The document of `kernels`.
    pub fn of(kernels: &[Kernel]) -> KernelsDocument {
        let tensors = |ts: &[KernelTensor]| {
            ts.iter()
                .map(|t| TensorJson {
                    dtype: t.dtype.name().to_string(),
                    shape: t.shape.clone(),
                })
                .collect()
        };
        KernelsDocument {
            format: FORMAT,
            kernels: kernels
                .iter()
                .map(|k| KernelJson {
                    op: k.op.clone(),
                    inputs: tensors(&k.inputs),
                    outputs: tensors(&k.outputs),
                    operands: k.operands.clone(),
                    mlir: k.mlir.clone(),
                    stablehlo_version: k.stablehlo_version.clone(),
                })
                .collect(),
        }
    }
}

/// A kernel for tests: `mylib.scale.default` on one float32[4, 8].
#[cfg(test)]
pub(crate) fn example() -> Kernel {
    Kernel {
        op: "mylib.scale.default".into(),
        inputs: vec![KernelTensor {
            dtype: DType::F32,
            shape: vec![4, 8],
        }],
        outputs: vec![KernelTensor {
            dtype: DType::F32,
            shape: vec![4, 8],
        }],
        operands: vec![0],
        mlir: "module {}".into(),
        stablehlo_version: "1.16.1".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_round_trips() {
        let doc = KernelsDocument::of(&[example()]);
        let text = serde_json::to_string(&doc).unwrap();
        let back: KernelsDocument = serde_json::from_str(&text).unwrap();
        assert_eq!(back.kernels().unwrap(), vec![example()]);
    }

    #[test]
    fn bad_kernels_are_named() {
        let mut k = example();
        k.operands = vec![1];
        assert!(check(&[k]).unwrap_err().contains("operands [1]"));
        let mut k = example();
        k.outputs[0].shape = vec![-1];
        assert!(check(&[k]).unwrap_err().contains("negative size"));
        let twice = check(&[example(), example()]).unwrap_err();
        assert_eq!(twice, "two kernels for mylib.scale.default(float32[4, 8])");
        let mut doc = KernelsDocument::of(&[example()]);
        doc.kernels[0].inputs[0].dtype = "float128".into();
        assert!(doc
            .kernels()
            .unwrap_err()
            .contains("unknown dtype \"float128\""));
        let mut doc = KernelsDocument::of(&[example()]);
        doc.format = 2;
        assert!(doc.kernels().unwrap_err().contains("format 2"));
    }
}
