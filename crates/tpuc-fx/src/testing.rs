//! Small graphs for the crate's unit tests.

use crate::graph::*;
use crate::DType;

fn meta() -> TensorMeta {
    TensorMeta {
        dtype: DType::F32,
        sizes: vec![Dim::Static(2)],
        strides: vec![Dim::Static(1)],
        storage_offset: 0,
    }
}

/// `x -> neg(arg) -> output`, with `arg` and the output naming what they are given.
pub(crate) fn neg_graph(arg: &str, output: &str) -> Graph {
    let mut g = Graph::default();
    g.inputs.push(GraphInput {
        name: "x".into(),
        kind: InputKind::UserInput,
    });
    g.nodes.push(Node {
        name: "neg".into(),
        target: "aten.neg.default".into(),
        inputs: vec![NamedArg {
            name: "self".into(),
            arg: Arg::Tensor(arg.into()),
            keyword: false,
        }],
        outputs: vec![NodeOutput::Tensor("y".into())],
        stack_trace: None,
    });
    g.outputs.push(GraphOutput {
        value: OutputValue::Tensor(output.into()),
        kind: OutputKind::User,
    });
    g.tensors.insert("x".into(), meta());
    g.tensors.insert("y".into(), meta());
    g
}
