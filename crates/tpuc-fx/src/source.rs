//! Python source positions from the stack traces torch records on each node.

use crate::graph::SourceLoc;

/// The innermost frame outside installed packages (torch, torchvision, ...) and code torch
/// generated (`<eval_with_key>.5`: the graph modules a higher-order operator's branches are
/// traced through): the user's line. Falls back to the innermost frame when every frame is
/// library code.
pub fn user_frame(stack_trace: &str) -> Option<SourceLoc> {
    let frames: Vec<SourceLoc> = stack_trace.lines().filter_map(parse_frame).collect();
    let is_library = |f: &SourceLoc| {
        f.file.contains("/site-packages/")
            || f.file.contains("/dist-packages/")
            || f.file.starts_with("<eval_with_key>")
    };
    frames
        .iter()
        .rev()
        .find(|f| !is_library(f))
        .or(frames.last())
        .cloned()
}

/// Parses `  File "path", line 12, in forward`.
fn parse_frame(line: &str) -> Option<SourceLoc> {
    let rest = line.trim_start().strip_prefix("File \"")?;
    let (file, rest) = rest.split_once('"')?;
    let rest = rest.strip_prefix(", line ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    Some(SourceLoc {
        file: file.to_string(),
        line: digits.parse().ok()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_innermost_user_frame() {
        let trace = "File \"/home/u/model.py\", line 6, in forward\n    h = s.l(x)\n  File \"/v/lib/python3.11/site-packages/torch/nn/modules/linear.py\", line 134, in forward\n    return F.linear(input)";
        let loc = user_frame(trace).unwrap();
        assert_eq!(loc.file, "/home/u/model.py");
        assert_eq!(loc.line, 6);
    }

    #[test]
    fn skips_code_torch_generated() {
        let trace = "File \"/home/u/m.py\", line 6, in forward\n  File \"<eval_with_key>.5\", line 10, in forward\n    cond = torch.ops.higher_order.cond(a)\n  File \"<eval_with_key>.6\", line 7, in forward\n    child = x + y";
        assert_eq!(user_frame(trace).unwrap().line, 6);
    }

    #[test]
    fn falls_back_to_library_frame_and_ignores_garbage() {
        let trace = "File \"/x/site-packages/torch/a.py\", line 9, in f";
        assert_eq!(user_frame(trace).unwrap().line, 9);
        assert_eq!(user_frame("no frames here"), None);
        assert_eq!(user_frame("File \"a.py\", line x"), None);
    }
}
