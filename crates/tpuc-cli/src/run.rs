//! `tpuc run`'s inputs: `.npy` tensors given to a model opened by `tpuc_driver::model`, which
//! binds and runs them. float32 data given for a bfloat16 input (numpy has no bfloat16) is
//! converted first.
use anyhow::Result;
use tpuc_driver::Loaded;
use tpuc_pjrt::HostTensor;

/// Runs `loaded` on `inputs` (its user inputs, in order); its user outputs.
pub fn run(loaded: &Loaded, inputs: Vec<HostTensor>) -> Result<Vec<HostTensor>> {
    let dtypes: Vec<_> = loaded.compiled().inputs.iter().map(|s| s.dtype).collect();
    Ok(loaded.run_on_host(crate::npy::adapt_all(inputs, &dtypes)?)?)
}
