//! `blobdrive completions bash|zsh|fish`: print a completion script for the
//! shell, generated from the same clap definitions the parser uses (so it
//! always knows every command and option of this binary).

use clap::{Args, CommandFactory, ValueEnum};
use clap_complete::Shell;

use super::{CmdResult, Context};

/// The shells completions are made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    /// GNU bash (bash-completion loads it from
    /// /usr/share/bash-completion/completions/blobdrive).
    Bash,
    /// zsh (from a directory of $fpath, as _blobdrive).
    Zsh,
    /// fish (from ~/.config/fish/completions/blobdrive.fish or the vendor directory).
    Fish,
}

/// Arguments of `completions`.
#[derive(Debug, Args)]
pub struct CompletionsArgs {
    /// The shell to print the script for.
    #[arg(value_enum)]
    pub shell: CompletionShell,
}

/// Print the completion script on stdout.
pub fn run(_ctx: &Context, args: &CompletionsArgs) -> CmdResult {
    let shell = match args.shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
    };
    let mut cmd = super::Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "blobdrive", &mut script);
    super::output::print_text(&String::from_utf8_lossy(&script));
    Ok(())
}
