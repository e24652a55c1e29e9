//! Ops with regions through the whole back end: built by the IR's builders, through the pass
//! pipeline (verified between passes), emitted, compiled by the XLA CPU plugin and run.
use libtest_mimic::{Failed, Trial};
use tpuc_emit::{emit, EmitFormat};
use tpuc_hlo::ir::{ArgAttrs, BinaryOp, Builder, CompareDir, DType, Module, Region, TensorType};
use tpuc_hlo::passes::{pipeline, PipelineOptions};
use tpuc_pjrt::{Client, ClientOptions, CompileOptions, HostTensor, Plugin};

fn cpu_client() -> Result<Client, Failed> {
    let path = tpuc_pjrt::discover::resolve(Some("cpu")).map_err(|e| e.to_string())?;
    let plugin = Plugin::load(&path).map_err(|e| e.to_string())?;
    Ok(Client::new(&plugin, &ClientOptions::default()).map_err(|e| e.to_string())?)
}

/// `module` through the pipeline, compiled and run on `inputs`: its outputs.
fn run(module: Module, inputs: &[HostTensor]) -> Result<Vec<HostTensor>, Failed> {
    let options = PipelineOptions {
        verify: true,
        ..PipelineOptions::default()
    };
    let module = pipeline(module, &options).map_err(|e| e.to_string())?.main;
    let bytes = emit(&module, EmitFormat::Bytecode).map_err(|e| e.to_string())?;
    let client = cpu_client()?;
    let exe = client
        .compile_mlir(&bytes, &CompileOptions::single_device())
        .map_err(|e| e.to_string())?;
    let device = &client.addressable_devices().map_err(|e| e.to_string())?[0];
    let buffers = inputs
        .iter()
        .map(|t| client.buffer_from_host(t, device))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?;
    let outputs = exe
        .execute_on_one_device(&buffers.iter().collect::<Vec<_>>())
        .map_err(|e| e.to_string())?;
    Ok(outputs
        .iter()
        .map(|b| b.to_host())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())?)
}

fn scalar_i32(v: i32) -> Result<HostTensor, Failed> {
    Ok(HostTensor::from_slice(DType::I32, &[], &[v]).map_err(|e| e.to_string())?)
}

/// A loop of several dtypes: an integer counter, a float accumulator, and a value of the
/// enclosing function carried through unchanged. sum_{i < n} (x + i), for x a vector.
fn a_loop_runs_as_many_steps_as_its_condition_says() -> Result<(), Failed> {
    let mut b = Builder::new();
    let x = b.arg(TensorType::new(vec![3], DType::F32), ArgAttrs::default());
    let n = b.arg(TensorType::scalar(DType::I32), ArgAttrs::default());
    let zero = b.scalar(DType::I32, 0.0);
    let acc = b.splat(&TensorType::new(vec![3], DType::F32), 0.0);
    let results = b.while_loop(
        &[zero, acc, x, n],
        |b, v| b.compare(CompareDir::Lt, v[0], v[3]),
        |b, v| {
            let (i, acc, x, n) = (v[0], v[1], v[2], v[3]);
            let as_float = b.convert(i, DType::F32);
            let wide = b.broadcast_to(as_float, &[3])?;
            let term = b.binary(BinaryOp::Add, x, wide)?;
            let acc = b.binary(BinaryOp::Add, acc, term)?;
            let one = b.scalar(DType::I32, 1.0);
            let i = b.binary(BinaryOp::Add, i, one)?;
            Ok(vec![i, acc, x, n])
        },
    )?;
    let module = Module::new(b.finish(vec![results[1], results[0]], vec![]));
    let x = HostTensor::from_slice(DType::F32, &[3], &[1.0f32, -2.0, 0.5])
        .map_err(|e| e.to_string())?;
    for steps in [0, 1, 5] {
        let out = run(module.clone(), &[x.clone(), scalar_i32(steps)?])?;
        let sum: Vec<f32> = out[0].to_vec().map_err(|e| e.to_string())?;
        let count: Vec<i32> = out[1].to_vec().map_err(|e| e.to_string())?;
        let triangle = (steps * (steps - 1) / 2) as f32;
        let want: Vec<f32> = [1.0f32, -2.0, 0.5]
            .iter()
            .map(|v| v * steps as f32 + triangle)
            .collect();
        if sum != want || count != [steps] {
            return Err(
                format!("{steps} steps: got {sum:?} after {count:?}, want {want:?}").into(),
            );
        }
    }
    Ok(())
}

/// A choice between three branches of two operands and two results; an index out of range
/// runs the last branch, as StableHLO says.
fn a_choice_runs_the_branch_its_index_picks() -> Result<(), Failed> {
    let mut b = Builder::new();
    let index = b.arg(TensorType::scalar(DType::I32), ArgAttrs::default());
    let x = b.arg(TensorType::new(vec![2], DType::F32), ArgAttrs::default());
    let y = b.arg(TensorType::new(vec![2], DType::F32), ArgAttrs::default());
    let pair = [b.ty(x).clone(), b.ty(y).clone()];
    let branch = |b: &Builder, op: BinaryOp| -> Result<Region, Failed> {
        Ok(b.region(&pair, |b, v| {
            let r = b.binary(op, v[0], v[1])?;
            Ok(vec![r, v[0]])
        })?)
    };
    let branches = vec![
        branch(&b, BinaryOp::Add)?,
        branch(&b, BinaryOp::Mul)?,
        branch(&b, BinaryOp::Sub)?,
    ];
    let results = b.case(index, &[x, y], branches)?;
    let module = Module::new(b.finish(results, vec![]));
    let x = HostTensor::from_slice(DType::F32, &[2], &[3.0f32, 4.0]).map_err(|e| e.to_string())?;
    let y = HostTensor::from_slice(DType::F32, &[2], &[2.0f32, 0.5]).map_err(|e| e.to_string())?;
    for (index, want) in [
        (0, [5.0f32, 4.5]),
        (1, [6.0, 2.0]),
        (2, [1.0, 3.5]),
        (7, [1.0, 3.5]),
    ] {
        let out = run(module.clone(), &[scalar_i32(index)?, x.clone(), y.clone()])?;
        let got: Vec<f32> = out[0].to_vec().map_err(|e| e.to_string())?;
        let passed: Vec<f32> = out[1].to_vec().map_err(|e| e.to_string())?;
        if got != want || passed != [3.0, 4.0] {
            return Err(format!("index {index}: got {got:?} and {passed:?}, want {want:?}").into());
        }
    }
    Ok(())
}

/// The first node of `target` in an archive's model.json.
fn node_of<'v>(v: &'v mut serde_json::Value, target: &str) -> &'v mut serde_json::Value {
    let nodes = v["graph_module"]["graph"]["nodes"]
        .as_array_mut()
        .expect("nodes");
    nodes
        .iter_mut()
        .find(|n| n["target"] == target)
        .expect("the archive has the node")
}

/// Archives whose subgraphs are missing, broken or mistyped, and operators with subgraphs tpuc
/// does not lower: clear errors naming the node (and the subgraph), never a format error.
fn bad_subgraphs_are_named() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    type Edit = Box<dyn Fn(&mut serde_json::Value)>;
    const COND: &str = "torch.ops.higher_order.cond";
    const LOOP: &str = "torch.ops.higher_order.while_loop";
    const CALL: &str = "torch.ops.higher_order.invoke_subgraph";
    const SCAN: &str = "torch.ops.higher_order.associative_scan";
    let cases: Vec<(&str, &str, Edit, Vec<&str>)> = vec![
        (
            "cond_branches",
            "branch_not_a_graph",
            Box::new(|v| {
                node_of(v, COND)["inputs"][1]["arg"] =
                    serde_json::json!({"as_tensor": {"name": "x"}})
            }),
            vec![
                "higher_order.cond",
                "true branch (argument 1) is of kind tensor, not a graph",
            ],
        ),
        (
            "cond_branches",
            "dangling_inside",
            Box::new(|v| {
                let branch = &mut node_of(v, COND)["inputs"][1]["arg"]["as_graph"];
                branch["graph"]["nodes"][0]["inputs"][0]["arg"] =
                    serde_json::json!({"as_tensor": {"name": "nowhere"}});
            }),
            vec!["subgraph true_graph_0: node", "undefined value nowhere"],
        ),
        (
            "cond_branches",
            "unlowered_operator",
            Box::new(|v| {
                node_of(v, COND)["target"] = "torch.ops.higher_order.flex_attention".into()
            }),
            vec!["higher_order.flex_attention"],
        ),
        (
            "while_loop",
            "body_changes_a_carried_value",
            Box::new(|v| {
                let body = &mut node_of(v, LOOP)["inputs"][1]["arg"]["as_graph"]["graph"];
                body["outputs"].as_array_mut().expect("outputs").reverse();
            }),
            vec![
                "higher_order.while_loop",
                "changes carried value 0 from tensor<i64> to tensor<f32>",
            ],
        ),
        (
            "invoke_subgraph",
            "identifier_not_a_string",
            Box::new(|v| node_of(v, CALL)["inputs"][1]["arg"] = serde_json::json!({"as_int": 3})),
            vec![
                "higher_order.invoke_subgraph",
                "identifier (argument 1) is of kind int, not a string",
            ],
        ),
        (
            "invoke_subgraph",
            "block_of_another_signature",
            Box::new(|v| {
                let inputs = node_of(v, CALL)["inputs"].as_array_mut().expect("inputs");
                inputs.swap(2, 3);
            }),
            vec![
                "subgraph repeated_subgraph0: input",
                "the node passes a tensor<6x6xf32>",
            ],
        ),
        (
            "associative_scan",
            "nothing_to_scan",
            Box::new(|v| {
                let combine = &mut node_of(v, SCAN)["inputs"][1]["arg"];
                *combine = serde_json::json!({"as_tensors": []});
            }),
            vec!["higher_order.associative_scan", "it has no input to scan"],
        ),
        (
            "cond_branches",
            "auto_functionalized_custom_op",
            Box::new(|v| {
                let node = node_of(v, COND);
                node["target"] = "torch.ops.higher_order.auto_functionalized_v2".into();
                node["inputs"][0]["arg"] =
                    serde_json::json!({"as_operator": "torch.ops.mylib.bump.default"});
            }),
            vec!["higher_order.auto_functionalized_v2 of mylib.bump.default (node cond)"],
        ),
        (
            "cond_branches",
            "triton_kernel",
            Box::new(|v| {
                let node = node_of(v, COND);
                node["target"] = "torch.ops.higher_order.triton_kernel_wrapper_functional".into();
                node["inputs"][1]["arg"] = serde_json::json!({"as_int_lists": [[1, 1, 1]]});
                node["inputs"][2]["arg"] = serde_json::json!({"as_string_to_argument": {}});
            }),
            vec!["higher_order.triton_kernel_wrapper_functional (node cond)"],
        ),
    ];
    for (archive, name, edit, needles) in cases {
        let p = dir.path().join(format!("{name}.pt2"));
        crate::with_model_json(
            &crate::lowering_dir().join(format!("{archive}.pt2")),
            &p,
            edit,
        )?;
        crate::expect_error(&p, &needles)?;
    }
    Ok(())
}

pub fn trials() -> Vec<Trial> {
    vec![
        Trial::test(
            "control_flow::bad_subgraphs_are_named",
            bad_subgraphs_are_named,
        ),
        Trial::test(
            "control_flow::a_loop_runs_as_many_steps_as_its_condition_says",
            a_loop_runs_as_many_steps_as_its_condition_says,
        ),
        Trial::test(
            "control_flow::a_choice_runs_the_branch_its_index_picks",
            a_choice_runs_the_branch_its_index_picks,
        ),
    ]
}
