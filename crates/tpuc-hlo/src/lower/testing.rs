//! Small FX graphs built in Rust for the lowering families' tests, and checks of the IR they
//! lower to (the printed form, `check` lines in order, as filecheck reads them).

use tpuc_fx::{Arg, DType, Dim, Graph, GraphInput, GraphOutput, InputKind, NamedArg, Node};
use tpuc_fx::{NodeOutput, OutputKind, OutputValue, Program, TensorMeta};

use crate::ir::{print, Module};
use crate::passes::{pipeline, PipelineOptions};

#[derive(Default)]
pub(super) struct TestGraph {
    graph: Graph,
}

fn meta(dtype: DType, sizes: &[i64]) -> TensorMeta {
    let mut strides = vec![1i64; sizes.len()];
    for i in (0..sizes.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * sizes[i + 1].max(1);
    }
    TensorMeta {
        dtype,
        sizes: sizes.iter().map(|&d| Dim::Static(d)).collect(),
        strides: strides.into_iter().map(Dim::Static).collect(),
        storage_offset: 0,
    }
}

/// A tensor argument.
pub(super) fn t(name: &str) -> Arg {
    Arg::Tensor(name.to_string())
}

impl TestGraph {
    /// A user input.
    pub(super) fn input(&mut self, name: &str, dtype: DType, sizes: &[i64]) -> String {
        self.graph.inputs.push(GraphInput {
            name: name.into(),
            kind: InputKind::UserInput,
        });
        self.graph.tensors.insert(name.into(), meta(dtype, sizes));
        name.into()
    }

    /// A node of `target` with these arguments, defining one tensor per `(dtype, sizes)`.
    pub(super) fn node(
        &mut self,
        target: &str,
        args: Vec<(&str, Arg)>,
        outputs: &[(DType, &[i64])],
    ) -> Vec<String> {
        let index = self.graph.nodes.len();
        let names: Vec<String> = (0..outputs.len())
            .map(|i| format!("n{index}_{i}"))
            .collect();
        for (name, (dtype, sizes)) in names.iter().zip(outputs) {
            self.graph.tensors.insert(name.clone(), meta(*dtype, sizes));
        }
        self.graph.nodes.push(Node {
            name: format!("node{index}"),
            target: target.into(),
            inputs: args
                .into_iter()
                .map(|(name, arg)| NamedArg {
                    name: name.into(),
                    arg,
                    keyword: false,
                })
                .collect(),
            outputs: names
                .iter()
                .map(|n| NodeOutput::Tensor(n.clone()))
                .collect(),
            stack_trace: None,
        });
        names
    }

    /// [`TestGraph::node`] with one output.
    pub(super) fn node1(
        &mut self,
        target: &str,
        args: Vec<(&str, Arg)>,
        dtype: DType,
        sizes: &[i64],
    ) -> String {
        self.node(target, args, &[(dtype, sizes)]).remove(0)
    }

    fn program(mut self, outputs: &[&str]) -> Program {
        self.graph.outputs = outputs
            .iter()
            .map(|o| GraphOutput {
                value: OutputValue::Tensor(o.to_string()),
                kind: OutputKind::User,
            })
            .collect();
        Program::new(self.graph, Default::default())
            .unwrap_or_else(|(at, what)| panic!("a test graph is not valid: {at}: {what}"))
    }

    /// The graph returning `outputs`, lowered and through the passes (verified between them).
    pub(super) fn lower(self, outputs: &[&str]) -> Result<Module, super::LowerError> {
        self.lower_with(outputs, &super::LowerOptions::default())
    }

    fn lower_with(
        self,
        outputs: &[&str],
        options: &super::LowerOptions,
    ) -> Result<Module, super::LowerError> {
        let program = self.program(outputs);
        let lowered = super::lower(&program, options)?;
        let options = PipelineOptions {
            verify: true,
            ..PipelineOptions::default()
        };
        Ok(pipeline(lowered.module, &options)
            .expect("the lowered module verifies")
            .main)
    }

    /// The graph returning `outputs` lowered as a program padded to buckets (`padding`),
    /// through the passes (verified between them).
    pub(super) fn lower_padded(
        self,
        outputs: &[&str],
        padding: tpuc_fx::buckets::Padding,
    ) -> Result<Module, super::LowerError> {
        let options = super::LowerOptions {
            padding: Some(std::sync::Arc::new(padding)),
            ..super::LowerOptions::default()
        };
        self.lower_with(outputs, &options)
    }

    /// The graph as one rank's program over `devices` devices (`ranks=N`), its collectives
    /// naming `groups`, lowered and made per device (verified).
    pub(super) fn lower_per_device(
        self,
        outputs: &[&str],
        groups: super::ProcessGroups,
        devices: i64,
    ) -> Result<Module, super::LowerError> {
        let program = self.program(outputs);
        let options = super::LowerOptions {
            process_groups: Some(groups),
            ..super::LowerOptions::default()
        };
        let lowered = super::lower(&program, &options)?;
        let options = PipelineOptions {
            verify: true,
            per_device: Some(crate::ir::Mesh::line("ranks", devices)),
            ..PipelineOptions::default()
        };
        Ok(pipeline(lowered.module, &options)
            .expect("the lowered module verifies")
            .main)
    }

    /// The printed IR of [`TestGraph::lower`].
    pub(super) fn text(self, outputs: &[&str]) -> String {
        print(&self.lower(outputs).expect("the graph lowers"))
    }
}

/// Each check appears in `text`, in this order.
#[track_caller]
pub(super) fn assert_checks(text: &str, checks: &[&str]) {
    let mut rest = text;
    for check in checks {
        match rest.find(check) {
            Some(at) => rest = &rest[at + check.len()..],
            None => panic!("expected `{check}` (after the previous checks) in:\n{text}"),
        }
    }
}
