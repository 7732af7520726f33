//! `natrix man` and `natrix completions` (both hidden): the manual pages and
//! shell completion scripts, generated from the command line's own clap
//! definitions so they never drift from it. `scripts/package.sh` runs them
//! to fill the Debian package.

use std::io::Write;
use std::path::Path;

use clap_complete::Shell;

use crate::Failure;

/// The DESCRIPTION of natrix(1); `natrix --help` keeps its one-line summary.
const DESCRIPTION: &str = "natrix is a software carrier-grade NAT (NAPT44) for ISPs and campus networks, \
following RFC 4787, 5382, 5508, 6888 and 7857: endpoint-independent mapping, paired pooling, port parity \
and preservation, per-subscriber quotas, port blocks, deterministic NAT (RFC 7422), NAT event logging \
(JSON, IPFIX, syslog) and a PCP server (RFC 6887). It runs live between two network interfaces \
(natrix run, over AF_XDP or AF_PACKET), or offline over a capture file (natrix replay). \
Each command has its own page, listed under SUBCOMMANDS.";

/// Sections of natrix(1) that clap knows nothing about, in roff.
const EXTRA_SECTIONS: &str = r#".SH "EXIT STATUS"
.TP
0
Success.
.TP
1
A failure other than the configuration: unreadable input, unwritable output, an unreachable management API; for \fBnatrix whois\fR, nobody held the address and port.
.TP
2
The configuration was refused (the message names the file, the key and the problem), or the command was used wrongly: an unknown option, a missing argument, an input file that is not there.
.SH SIGNALS
\fBnatrix run\fR stops cleanly on SIGTERM or SIGINT (every dynamic mapping ends and is logged as deleted, exit 0) and re\-reads its configuration on SIGHUP: policy keys apply at once, while a change that needs a restart (interfaces, addresses, workers, I/O mode) is refused with a message naming the key, and the running configuration stays.
.SH FILES
.TP
\fI/etc/natrix/natrix.toml\fR
The configuration that \fBnatrix.service\fR runs with; check it with \fBnatrix check\-config /etc/natrix/natrix.toml\fR.
.TP
\fI/var/log/natrix/\fR
Where the service may write its JSON event log (\fB[logging] json\fR).
.TP
\fI/run/natrix/\fR
The service's runtime directory.
.SH "SEE ALSO"
\fBsystemctl\fR(1), \fBethtool\fR(8), and \fI/usr/share/doc/natrix/README.md\fR, the operator's guide: configuration reference, live mode, metrics, logging.
"#;

/// Writes natrix.1 and one page per visible subcommand (natrix-run.1,
/// natrix-pcp-map.1, ...) into `out`, or natrix.1 alone to stdout.
pub fn man(cmd: clap::Command, out: Option<&Path>) -> Result<(), Failure> {
    let mut cmd = cmd.about("a software carrier-grade NAT (NAPT44)").long_about(DESCRIPTION).disable_help_subcommand(true);
    cmd.build();
    let version = cmd.get_version().unwrap_or_default().to_owned();
    let page = |c: clap::Command| clap_mangen::Man::new(c).source(format!("natrix {version}")).manual("natrix manual");
    let mut top = Vec::new();
    render_top(&page(cmd.clone()), &mut top).map_err(|e| Failure::Other(format!("rendering natrix.1: {e}")))?;
    let Some(dir) = out else {
        return std::io::stdout().write_all(&top).map_err(|e| Failure::Other(format!("writing natrix.1: {e}")));
    };
    std::fs::create_dir_all(dir).map_err(|e| Failure::Other(format!("{}: {e}", dir.display())))?;
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).map_err(|e| Failure::Other(format!("{}: {e}", path.display())))
    };
    write("natrix.1", &top)?;
    let mut pending: Vec<clap::Command> = visible_subcommands(&cmd);
    while let Some(sub) = pending.pop() {
        pending.extend(visible_subcommands(&sub));
        let man = page(sub);
        let mut bytes = Vec::new();
        man.render(&mut bytes).map_err(|e| Failure::Other(format!("rendering {}: {e}", man.get_filename())))?;
        write(&man.get_filename(), &bytes)?;
    }
    Ok(())
}

fn visible_subcommands(cmd: &clap::Command) -> Vec<clap::Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned().collect()
}

/// clap_mangen's sections with EXIT STATUS, SIGNALS, FILES and SEE ALSO
/// before VERSION.
fn render_top(man: &clap_mangen::Man, w: &mut Vec<u8>) -> std::io::Result<()> {
    man.render_title(w)?;
    man.render_name_section(w)?;
    man.render_synopsis_section(w)?;
    man.render_description_section(w)?;
    man.render_options_section(w)?;
    man.render_subcommands_section(w)?;
    w.write_all(EXTRA_SECTIONS.as_bytes())?;
    man.render_version_section(w)
}

/// Prints the completion script for `shell` on stdout.
pub fn completions(mut cmd: clap::Command, shell: Shell) -> Result<(), Failure> {
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut cmd, "natrix", &mut out);
    std::io::stdout().write_all(&out).map_err(|e| Failure::Other(format!("writing the completions: {e}")))
}
