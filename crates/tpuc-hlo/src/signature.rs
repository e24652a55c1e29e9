//! The contract between a compiled module and whoever runs it: what each argument of `main`
//! stands for (a weight, a user input, the random seed, a value derived from the weights) and
//! what each result is. The lowering writes it, hoisting extends it, and the runtimes (the CLI,
//! the Python extension) read it; nothing else describes the arguments.

use tpuc_fx::OutputKind;

/// What one argument of `main` stands for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ArgRole {
    /// A parameter, buffer or constant with this fully qualified name.
    Weight(String),
    /// A user input of the program, by its placeholder name.
    UserInput(String),
    /// The random-number generator's seed, tensor<2xui64>, after the program's own arguments
    /// when it has random ops. Each call passes a fresh seed (the torch.compile backend draws
    /// it from torch's generator; `tpuc run` takes `--seed`). See docs/random.md.
    RngSeed,
    /// The `n`-th value the prepared module computes from the weights (see [`Prepared`]).
    Derived(usize),
    /// The true value of a symbolic size, an i64 scalar, in a program compiled for the size's
    /// bucket (its inputs padded to it).
    Size(String),
}

/// One result of `main`.
#[derive(Clone, Debug, PartialEq)]
pub struct ResultRole {
    /// The tensor's name in the program.
    pub name: String,
    pub kind: OutputKind,
}

impl ResultRole {
    /// A result the user asked for (an output or a loss), not an update of program state.
    pub fn is_user_output(&self) -> bool {
        matches!(self.kind, OutputKind::User | OutputKind::Loss)
    }
}

/// The prepared module of a hoisted program: it reads the arguments of `main` at `reads` (all
/// stable) and computes the values `main` takes as its [`ArgRole::Derived`] arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prepared {
    pub reads: Vec<usize>,
    pub outputs: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    pub args: Vec<ArgRole>,
    pub results: Vec<ResultRole>,
    pub prepared: Option<Prepared>,
}

impl Signature {
    /// Adds the prepared module's values as trailing arguments.
    pub fn with_prepared(mut self, reads: Vec<usize>, outputs: usize) -> Signature {
        self.args.extend((0..outputs).map(ArgRole::Derived));
        self.prepared = Some(Prepared { reads, outputs });
        self
    }

    /// Whether the program has random ops (and so takes a seed).
    pub fn takes_seed(&self) -> bool {
        self.args.contains(&ArgRole::RngSeed)
    }

    /// The program's own arguments: those before the derived values.
    pub fn own_args(&self) -> usize {
        self.args.len() - self.prepared.as_ref().map_or(0, |p| p.outputs)
    }

    /// One flag per argument: true for those that stay the same from call to call. Weights and
    /// derived values do; the seed does not; user inputs as `inputs` says (one flag each, in
    /// order; none when `inputs` is None).
    pub fn stable_flags(&self, inputs: Option<&[bool]>) -> Result<Vec<bool>, String> {
        let users = self
            .args
            .iter()
            .filter(|r| matches!(r, ArgRole::UserInput(_)))
            .count();
        if let Some(given) = inputs {
            if given.len() != users {
                return Err(format!(
                    "{} stable flags given for {users} program inputs",
                    given.len()
                ));
            }
        }
        let mut next = 0;
        Ok(self
            .args
            .iter()
            .map(|role| match role {
                ArgRole::Weight(_) | ArgRole::Derived(_) => true,
                ArgRole::RngSeed | ArgRole::Size(_) => false,
                ArgRole::UserInput(_) => {
                    next += 1;
                    inputs.is_some_and(|given| given[next - 1])
                }
            })
            .collect())
    }

    /// One flag per argument: true for the user inputs (what data parallelism splits).
    pub fn user_input_flags(&self) -> Vec<bool> {
        self.args
            .iter()
            .map(|r| matches!(r, ArgRole::UserInput(_)))
            .collect()
    }

    /// The argument positions of the user inputs, in order.
    pub fn user_input_positions(&self) -> Vec<usize> {
        (0..self.args.len())
            .filter(|&i| matches!(self.args[i], ArgRole::UserInput(_)))
            .collect()
    }

    /// The argument position of user input `index`.
    pub fn user_input_position(&self, index: usize) -> Option<usize> {
        self.user_input_positions().get(index).copied()
    }

    /// Positions of the results the user asked for.
    pub fn user_outputs(&self) -> Vec<usize> {
        (0..self.results.len())
            .filter(|&i| self.results[i].is_user_output())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signature() -> Signature {
        Signature {
            args: vec![
                ArgRole::Weight("w".into()),
                ArgRole::UserInput("x".into()),
                ArgRole::UserInput("y".into()),
                ArgRole::RngSeed,
            ],
            results: vec![
                ResultRole {
                    name: "out".into(),
                    kind: OutputKind::User,
                },
                ResultRole {
                    name: "buf".into(),
                    kind: OutputKind::BufferMutation { target: "b".into() },
                },
            ],
            prepared: None,
        }
    }

    #[test]
    fn stable_flags_cover_every_argument() {
        let s = signature();
        assert_eq!(s.stable_flags(None).unwrap(), [true, false, false, false]);
        assert_eq!(
            s.stable_flags(Some(&[false, true])).unwrap(),
            [true, false, true, false]
        );
        let e = s.stable_flags(Some(&[true])).unwrap_err();
        assert!(
            e.contains("1 stable flags given for 2 program inputs"),
            "{e}"
        );
        let h = s.with_prepared(vec![0], 2);
        assert_eq!(h.own_args(), 4);
        assert_eq!(h.args[4..], [ArgRole::Derived(0), ArgRole::Derived(1)]);
        assert_eq!(h.stable_flags(None).unwrap()[4..], [true, true]);
        assert!(h.takes_seed());
        assert_eq!(h.user_outputs(), [0]);
        assert_eq!(
            h.user_input_flags(),
            [false, true, true, false, false, false]
        );
    }
}
