//! An FX graph written as text, one statement a line, read into a [`tpuc_fx::Program`]:
//!
//! ```text
//! input x: float32[2, 3]
//! parameter w: float32[4, 3]
//! y: float32[2, 4] = aten.mm.default(self=x, mat2=w)
//! values: float32[2], indices: int64[2] = aten.max.dim(self=y, dim=1)
//! output values, indices
//! ```
//!
//! - Graph inputs: `input`, `parameter`, `buffer` or `constant`, a name and a type (a dtype by
//!   torch's name and sizes; a size that is a name is a symbol). Weights hold zeros: the cases
//!   check what the lowering makes, not numbers.
//! - A node: its outputs (`name: type`, `[name: type, ...]` for a list of tensors, `_` for an
//!   output slot with nothing in it), `=`, the ATen overload, and its arguments by their schema
//!   names, as the lowering reads them.
//! - Argument values: a tensor's name; `None`, `True`, `False`; numbers (`2`, `-1.5`, `1e-5`,
//!   `inf`, `-inf`, `nan`); `"text"`; `torch.float32` (a scalar type); `memory_format(N)`,
//!   `layout(N)` (torch.export's codes); `device("cpu")`, `device("cuda", 0)`; and lists of these
//!   in brackets (`[x, None]` is a list of optional tensors).
//! - `output` and the names the graph returns.
//!
//! A node is named after its first output, as torch names them.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use tpuc_fx::{Arg, DType, Dim, Graph, GraphInput, GraphOutput, InputKind, NamedArg, Node};
use tpuc_fx::{NodeOutput, OutputKind, OutputValue, Program, TensorMeta, Weight, WeightBytes};

/// What is wrong with a graph's text, and on which line of the case file.
#[derive(Debug, PartialEq, Eq)]
pub struct ParseError {
    pub line: usize,
    pub message: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "line {}: {}", self.line, self.message)
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Name(String),
    Int(i64),
    Float(f64),
    Text(String),
    Punct(char),
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Token::Name(n) => write!(f, "`{n}`"),
            Token::Int(i) => write!(f, "`{i}`"),
            Token::Float(x) => write!(f, "`{x}`"),
            Token::Text(s) => write!(f, "{s:?}"),
            Token::Punct(c) => write!(f, "`{c}`"),
        }
    }
}

fn tokenize(line: &str) -> Result<Vec<Token>, String> {
    let chars: Vec<char> = line.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || "_.".contains(chars[i])) {
                i += 1;
            }
            tokens.push(Token::Name(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit()
            || (c == '-' && chars.get(i + 1).is_some_and(|d| d.is_ascii_digit()))
        {
            let start = i;
            i += 1;
            let mut float = false;
            while i < chars.len() {
                let d = chars[i];
                let exponent_sign = "+-".contains(d) && "eE".contains(chars[i - 1]);
                if d.is_ascii_digit() || exponent_sign {
                    i += 1;
                } else if ".eE".contains(d) {
                    float = true;
                    i += 1;
                } else {
                    break;
                }
            }
            let text: String = chars[start..i].iter().collect();
            tokens.push(if float {
                Token::Float(text.parse().map_err(|_| format!("bad number {text}"))?)
            } else {
                Token::Int(text.parse().map_err(|_| format!("bad integer {text}"))?)
            });
        } else if c == '"' {
            let mut text = String::new();
            i += 1;
            loop {
                match chars.get(i) {
                    None => return Err("a string is not closed".into()),
                    Some('"') => break,
                    Some('\\') if i + 1 < chars.len() => {
                        text.push(chars[i + 1]);
                        i += 2;
                    }
                    Some(&other) => {
                        text.push(other);
                        i += 1;
                    }
                }
            }
            i += 1;
            tokens.push(Token::Text(text));
        } else if ":,=()[]-".contains(c) {
            tokens.push(Token::Punct(c));
            i += 1;
        } else {
            return Err(format!("unexpected character {c:?}"));
        }
    }
    Ok(tokens)
}

/// The tokens of one statement, read front to back.
struct Statement {
    tokens: Vec<Token>,
    at: usize,
}

impl Statement {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.at)
    }

    fn next(&mut self) -> Result<Token, String> {
        let t = self
            .tokens
            .get(self.at)
            .cloned()
            .ok_or_else(|| "the line ends too early".to_string())?;
        self.at += 1;
        Ok(t)
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Token::Punct(c)) {
            self.at += 1;
            true
        } else {
            false
        }
    }

    fn expect(&mut self, c: char) -> Result<(), String> {
        match self.next()? {
            Token::Punct(p) if p == c => Ok(()),
            other => Err(format!("expected `{c}`, found {other}")),
        }
    }

    fn name(&mut self) -> Result<String, String> {
        match self.next()? {
            Token::Name(n) => Ok(n),
            other => Err(format!("expected a name, found {other}")),
        }
    }

    fn end(&self) -> Result<(), String> {
        match self.peek() {
            None => Ok(()),
            Some(t) => Err(format!("unexpected {t} at the end of the line")),
        }
    }

    /// A type: `float32[2, s0, 4]`.
    fn tensor_type(&mut self) -> Result<TensorMeta, String> {
        let dtype_name = self.name()?;
        let dtype = DType::from_name(&dtype_name)
            .ok_or_else(|| format!("{dtype_name} is not a dtype tpuc knows"))?;
        self.expect('[')?;
        let mut sizes = Vec::new();
        while !self.eat(']') {
            if !sizes.is_empty() {
                self.expect(',')?;
            }
            sizes.push(match self.next()? {
                Token::Int(n) if n >= 0 => Dim::Static(n),
                Token::Name(symbol) => Dim::Symbolic {
                    expr: symbol,
                    hint: None,
                },
                other => return Err(format!("expected a size, found {other}")),
            });
        }
        Ok(contiguous(dtype, sizes))
    }

    fn value(&mut self) -> Result<Arg, String> {
        Ok(match self.next()? {
            Token::Int(i) => Arg::Int(i),
            Token::Float(x) => Arg::Float(x),
            Token::Text(s) => Arg::Str(s),
            Token::Punct('-') => match self.name()?.as_str() {
                "inf" => Arg::Float(f64::NEG_INFINITY),
                other => return Err(format!("expected a number after `-`, found `{other}`")),
            },
            Token::Punct('[') => self.list()?,
            Token::Name(n) => match n.as_str() {
                "None" => Arg::None,
                "True" => Arg::Bool(true),
                "False" => Arg::Bool(false),
                "inf" => Arg::Float(f64::INFINITY),
                "nan" => Arg::Float(f64::NAN),
                "memory_format" | "layout" => {
                    self.expect('(')?;
                    let code = match self.next()? {
                        Token::Int(code) => code,
                        other => return Err(format!("expected {n}'s code, found {other}")),
                    };
                    self.expect(')')?;
                    if n == "layout" {
                        Arg::Layout(code)
                    } else {
                        Arg::MemoryFormat(code)
                    }
                }
                "device" => {
                    self.expect('(')?;
                    let kind = match self.next()? {
                        Token::Text(kind) => kind,
                        other => return Err(format!("expected a device kind, found {other}")),
                    };
                    let index = if self.eat(',') {
                        match self.next()? {
                            Token::Int(i) => Some(i),
                            other => return Err(format!("expected a device index, found {other}")),
                        }
                    } else {
                        None
                    };
                    self.expect(')')?;
                    Arg::Device { kind, index }
                }
                _ => match n.strip_prefix("torch.") {
                    Some(dtype) => Arg::ScalarType(
                        DType::from_name(dtype)
                            .ok_or_else(|| format!("{n} is not a dtype tpuc knows"))?,
                    ),
                    None => Arg::Tensor(n),
                },
            },
            other => return Err(format!("expected a value, found {other}")),
        })
    }

    /// A list, after its `[`: one kind of element, as torch's schema has them.
    fn list(&mut self) -> Result<Arg, String> {
        let mut items = Vec::new();
        while !self.eat(']') {
            if !items.is_empty() {
                self.expect(',')?;
            }
            items.push(self.value()?);
        }
        let all = |f: fn(&Arg) -> bool| items.iter().all(f);
        Ok(if all(|a| matches!(a, Arg::Int(_))) {
            Arg::Ints(items.iter().map(as_int).collect())
        } else if all(|a| matches!(a, Arg::Int(_) | Arg::Float(_))) {
            Arg::Floats(
                items
                    .iter()
                    .map(|a| match a {
                        Arg::Float(x) => *x,
                        other => as_int(other) as f64,
                    })
                    .collect(),
            )
        } else if all(|a| matches!(a, Arg::Bool(_))) {
            Arg::Bools(items.iter().map(|a| matches!(a, Arg::Bool(true))).collect())
        } else if all(|a| matches!(a, Arg::Str(_))) {
            Arg::Strs(items.into_iter().map(text_of).collect())
        } else if all(|a| matches!(a, Arg::Tensor(_))) {
            Arg::Tensors(items.into_iter().map(text_of).collect())
        } else if all(|a| matches!(a, Arg::Tensor(_) | Arg::None)) {
            Arg::OptionalTensors(
                items
                    .into_iter()
                    .map(|a| match a {
                        Arg::None => None,
                        other => Some(text_of(other)),
                    })
                    .collect(),
            )
        } else {
            return Err("a list mixes kinds of values".into());
        })
    }
}

fn as_int(a: &Arg) -> i64 {
    match a {
        Arg::Int(i) => *i,
        _ => unreachable!("checked to be an int"),
    }
}

fn text_of(a: Arg) -> String {
    match a {
        Arg::Str(s) | Arg::Tensor(s) => s,
        _ => unreachable!("checked to be a string or a tensor"),
    }
}

/// A row-major tensor of these sizes (a stride after a symbolic size is the product's
/// expression).
fn contiguous(dtype: DType, sizes: Vec<Dim>) -> TensorMeta {
    let mut strides = Vec::with_capacity(sizes.len());
    let mut number = 1i64;
    let mut symbols: Vec<String> = Vec::new();
    for size in sizes.iter().rev() {
        strides.push(if symbols.is_empty() {
            Dim::Static(number)
        } else {
            let mut factors = vec![number.to_string()];
            factors.extend(symbols.iter().cloned());
            Dim::Symbolic {
                expr: factors.join("*"),
                hint: None,
            }
        });
        match size {
            Dim::Static(n) => number *= (*n).max(1),
            Dim::Symbolic { expr, .. } => symbols.push(expr.clone()),
        }
    }
    strides.reverse();
    TensorMeta {
        dtype,
        sizes,
        strides,
        storage_offset: 0,
    }
}

/// The graph of these lines: (line number, text) pairs, comments and other directives already
/// taken out.
pub fn parse_program(lines: &[(usize, &str)]) -> Result<Program, ParseError> {
    let mut graph = Graph::default();
    let mut weights = HashMap::new();
    let mut last_line = 0;
    for &(line, text) in lines {
        last_line = line;
        statement(text, &mut graph, &mut weights)
            .map_err(|message| ParseError { line, message })?;
    }
    if graph.outputs.is_empty() {
        return Err(ParseError {
            line: last_line,
            message: "the graph has no `output` line".into(),
        });
    }
    Program::new(graph, weights).map_err(|(at, what)| ParseError {
        line: last_line,
        message: format!("the graph is not valid: {at}: {what}"),
    })
}

fn statement(
    text: &str,
    graph: &mut Graph,
    weights: &mut HashMap<String, Weight>,
) -> Result<(), String> {
    let mut s = Statement {
        tokens: tokenize(text)?,
        at: 0,
    };
    let first = match s.peek() {
        Some(Token::Name(n)) => n.clone(),
        _ => String::new(),
    };
    match first.as_str() {
        "input" | "parameter" | "buffer" | "constant" => {
            s.next()?;
            let name = s.name()?;
            s.expect(':')?;
            let meta = s.tensor_type()?;
            s.end()?;
            let kind = match first.as_str() {
                "input" => InputKind::UserInput,
                "parameter" => InputKind::Parameter {
                    target: name.clone(),
                },
                "buffer" => InputKind::Buffer {
                    target: name.clone(),
                    persistent: true,
                },
                _ => InputKind::Constant {
                    target: name.clone(),
                },
            };
            if kind != InputKind::UserInput {
                weights.insert(name.clone(), zeros(&meta)?);
            }
            define(graph, &name, meta)?;
            graph.inputs.push(GraphInput { name, kind });
        }
        "output" => {
            s.next()?;
            loop {
                let name = s.name()?;
                graph.outputs.push(GraphOutput {
                    value: OutputValue::Tensor(name),
                    kind: OutputKind::User,
                });
                if !s.eat(',') {
                    break;
                }
            }
            s.end()?;
        }
        _ => node(&mut s, graph)?,
    }
    Ok(())
}

fn define(graph: &mut Graph, name: &str, meta: TensorMeta) -> Result<(), String> {
    if graph.tensors.insert(name.to_string(), meta).is_some() {
        return Err(format!("{name} is defined twice"));
    }
    Ok(())
}

fn zeros(meta: &TensorMeta) -> Result<Weight, String> {
    let sizes = meta
        .static_sizes()
        .ok_or("a weight's sizes are numbers, not symbols")?;
    let elements: i64 = sizes.iter().product();
    Ok(Weight {
        dtype: meta.dtype,
        bytes: WeightBytes::Owned(Arc::new(vec![
            0;
            elements as usize * meta.dtype.byte_size()
        ])),
        sizes,
    })
}

/// `outputs = target(name=value, ...)`.
fn node(s: &mut Statement, graph: &mut Graph) -> Result<(), String> {
    let mut outputs = Vec::new();
    loop {
        outputs.push(if s.eat('[') {
            let mut names = Vec::new();
            while !s.eat(']') {
                if !names.is_empty() {
                    s.expect(',')?;
                }
                let name = s.name()?;
                s.expect(':')?;
                define(graph, &name, s.tensor_type()?)?;
                names.push(name);
            }
            NodeOutput::Tensors(names)
        } else {
            let name = s.name()?;
            if name == "_" {
                NodeOutput::None
            } else {
                s.expect(':')?;
                define(graph, &name, s.tensor_type()?)?;
                NodeOutput::Tensor(name)
            }
        });
        if !s.eat(',') {
            break;
        }
    }
    s.expect('=')?;
    let target = s.name()?;
    s.expect('(')?;
    let mut inputs = Vec::new();
    while !s.eat(')') {
        if !inputs.is_empty() {
            s.expect(',')?;
        }
        let name = s.name()?;
        s.expect('=')?;
        inputs.push(NamedArg {
            name,
            arg: s.value()?,
            keyword: false,
        });
    }
    s.end()?;
    let name = outputs
        .iter()
        .find_map(|o| match o {
            NodeOutput::Tensor(n) => Some(n.clone()),
            NodeOutput::Tensors(ns) => ns.first().cloned(),
            _ => None,
        })
        .unwrap_or_else(|| format!("node{}", graph.nodes.len()));
    graph.nodes.push(Node {
        name,
        target,
        inputs,
        outputs,
        stack_trace: None,
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Program, ParseError> {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l))
            .filter(|(_, l)| !l.trim().is_empty())
            .collect();
        parse_program(&lines)
    }

    #[test]
    fn a_graph_reads_into_a_program() {
        let program = parse(
            "input x: float32[2, 3]\n\
             parameter w: float32[4, 3]\n\
             y: float32[2, 4] = aten.linear.default(input=x, weight=w, bias=None)\n\
             v: float32[2], i: int64[2] = aten.max.dim(self=y, dim=-1, keepdim=False)\n\
             [a: float32[1, 4], b: float32[1, 4]] = aten.split.Tensor(self=y, split_size=1, dim=0)\n\
             output v, i, a",
        )
        .unwrap();
        let g = program.graph();
        assert_eq!(g.nodes.len(), 3);
        assert_eq!(g.nodes[1].name, "v");
        assert_eq!(g.nodes[1].arg("dim"), Some(&Arg::Int(-1)));
        assert_eq!(g.nodes[0].arg("bias"), Some(&Arg::None));
        assert_eq!(
            g.nodes[2].outputs,
            vec![NodeOutput::Tensors(vec!["a".into(), "b".into()])]
        );
        assert_eq!(program.weights()["w"].bytes.as_slice().len(), 4 * 3 * 4);
        assert_eq!(g.tensor("y").unwrap().describe(), "float32[2, 4]");
        assert_eq!(g.outputs.len(), 3);
    }

    #[test]
    fn values_of_every_kind_read() {
        let mut s = Statement {
            tokens: tokenize(
                "[1, 2.5] [x, None] -inf 1e-5 torch.bfloat16 \"mean\" [True, False] \
                 device(\"cuda\", 1) memory_format(2) [\"a\", \"b\"]",
            )
            .unwrap(),
            at: 0,
        };
        let values: Vec<Arg> = (0..10).map(|_| s.value().unwrap()).collect();
        assert_eq!(
            values,
            vec![
                Arg::Floats(vec![1.0, 2.5]),
                Arg::OptionalTensors(vec![Some("x".into()), None]),
                Arg::Float(f64::NEG_INFINITY),
                Arg::Float(1e-5),
                Arg::ScalarType(DType::BF16),
                Arg::Str("mean".into()),
                Arg::Bools(vec![true, false]),
                Arg::Device {
                    kind: "cuda".into(),
                    index: Some(1)
                },
                Arg::MemoryFormat(2),
                Arg::Strs(vec!["a".into(), "b".into()]),
            ]
        );
    }

    #[test]
    fn mistakes_name_their_line() {
        let cases = [
            ("input x: float33[2]\noutput x", 1, "float33 is not a dtype"),
            (
                "input x: float32[2]\ny: float32[2] = aten.relu.default(self=z)\noutput y",
                3,
                "z",
            ),
            (
                "input x: float32[2]\ninput x: float32[2]\noutput x",
                2,
                "x is defined twice",
            ),
            (
                "input x: float32[2]\ny: float32[2] = aten.neg.default(self=x",
                2,
                "ends too early",
            ),
            ("input x: float32[2]", 1, "no `output` line"),
            (
                "input x: float32[2] extra\noutput x",
                1,
                "unexpected `extra`",
            ),
            (
                "input x: float32[2]\ny: float32[2] = f(a=[x, 1])\noutput y",
                2,
                "mixes kinds",
            ),
            (
                "input x: float32[2] @\noutput x",
                1,
                "unexpected character '@'",
            ),
        ];
        for (text, line, needle) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, line, "{text}: {e}");
            assert!(e.message.contains(needle), "{text}: {e}");
        }
    }
}
