//! A model opened by `tpuc_driver::model` and run as `tpuc run` runs it (float32 given for
//! bfloat16 inputs converted first), for the tests.
use std::path::Path;

use tpuc_driver::model::OpenTimings;
use tpuc_driver::{InputSpec, Loaded, RunOptions};
use tpuc_pjrt::HostTensor;

pub struct Runner {
    pub loaded: Loaded,
    pub timings: OpenTimings,
}

impl Runner {
    pub fn new(
        model: &Path,
        weights: Option<&Path>,
        options: &RunOptions,
    ) -> anyhow::Result<Runner> {
        let (loaded, timings) = tpuc_driver::model::open(model, weights, options)?;
        Ok(Runner { loaded, timings })
    }

    pub fn run(&self, inputs: Vec<HostTensor>) -> anyhow::Result<Vec<HostTensor>> {
        let dtypes: Vec<_> = self.inputs().iter().map(|s| s.dtype).collect();
        Ok(self
            .loaded
            .run_on_host(tpuc_npy::adapt_all(inputs, &dtypes)?)?)
    }

    pub fn not_padded(&self) -> Option<&str> {
        self.loaded.compiled().not_padded.as_deref()
    }

    pub fn inputs(&self) -> &[InputSpec] {
        &self.loaded.compiled().inputs
    }

    pub fn is_prepared(&self) -> bool {
        self.loaded.compiled().prepared.is_some()
    }

    pub fn compiled_memory(&self) -> anyhow::Result<tpuc_pjrt::CompiledMemory> {
        Ok(self.loaded.compiled().executable.compiled_memory()?)
    }

    pub fn weight_bytes_per_device(&self) -> anyhow::Result<Vec<usize>> {
        Ok(self.loaded.weight_bytes_per_device()?)
    }
}
