//! The soak's client processes (the ranks of its job): each started at a resume position, its
//! checkpoint lines read on a thread of its own, SIGKILLed and started again at the position
//! after the last checkpoint it printed whole.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::thread::JoinHandle;

use super::client::ClientLine;
use super::fleet::{self, Running};
use super::Soak;
use crate::bench::{Error, Result};

/// What one line a client printed says.
pub enum Said {
    /// A checkpoint or a failure.
    Line(ClientLine),
    /// Something that is not a client line.
    Garbled(String),
}

/// One rank's process and where it resumes.
struct Rank {
    running: Option<Running>,
    stdin: Option<ChildStdin>,
    reader: Option<JoinHandle<()>>,
    /// Where its next segment starts: (epoch, step).
    resume: (u64, u64),
}

/// Every rank's process.
pub struct Clients {
    program: PathBuf,
    /// The arguments of rank `r`'s client, without the resume position.
    args: Vec<Vec<String>>,
    lines_tx: mpsc::Sender<(u32, String)>,
    lines: mpsc::Receiver<(u32, String)>,
    ranks: Vec<Rank>,
}

impl Clients {
    /// Starts one client per entry of `args` (rank order), each at epoch 0, step 0.
    pub fn launch(program: PathBuf, args: Vec<Vec<String>>, soak: &mut Soak) -> Result<Clients> {
        let (lines_tx, lines) = mpsc::channel();
        let ranks = args
            .iter()
            .map(|_| Rank {
                running: None,
                stdin: None,
                reader: None,
                resume: (0, 0),
            })
            .collect();
        let mut clients = Clients {
            program,
            args,
            lines_tx,
            lines,
            ranks,
        };
        for rank in 0..clients.ranks.len() {
            clients.start(rank, soak)?;
        }
        Ok(clients)
    }

    /// Starts rank `rank`'s client at its resume position (after a kill: where its last
    /// checkpoint left off), as a new incarnation.
    pub fn start(&mut self, rank: usize, soak: &mut Soak) -> Result<()> {
        let (epoch, step) = self.ranks[rank].resume;
        let mut child = Command::new(&self.program)
            .args(&self.args[rank])
            .args([
                "--resume-epoch".to_string(),
                epoch.to_string(),
                "--resume-step".to_string(),
                step.to_string(),
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(soak.log.try_clone()?)
            .spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| Error::Failed("client stdout was not piped".into()))?;
        let tx = self.lines_tx.clone();
        let tag = rank as u32;
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout)
                .lines()
                .map_while(std::io::Result::ok)
            {
                if tx.send((tag, line)).is_err() {
                    break;
                }
            }
        });
        let started = soak.now();
        let incarnation = soak.new_incarnation("client", rank, started);
        let mut running = fleet::running(child, incarnation);
        let slot = &mut self.ranks[rank];
        slot.stdin = running.take_stdin();
        slot.running = Some(running);
        slot.reader = Some(reader);
        Ok(())
    }

    /// SIGKILLs rank `rank`'s client and waits until every line it printed is queued; call
    /// [`Clients::take_lines`] before [`Clients::start`], so that it resumes after them.
    pub fn kill(&mut self, rank: usize) {
        let slot = &mut self.ranks[rank];
        if let Some(mut running) = slot.running.take() {
            running.kill();
        }
        slot.stdin.take();
        if let Some(reader) = slot.reader.take() {
            // The pipe is closed with the process: the reader ends at its last whole line.
            let _ = reader.join();
        }
    }

    /// The lines printed since the last call, each rank's resume position moved past its
    /// checkpoints.
    pub fn take_lines(&mut self) -> Vec<(u32, Said)> {
        let mut said = Vec::new();
        while let Ok((rank, line)) = self.lines.try_recv() {
            match serde_json::from_str::<ClientLine>(&line) {
                Ok(line) => {
                    if let ClientLine::Segment(read) = &line {
                        self.ranks[rank as usize].resume = read.next();
                    }
                    said.push((rank, Said::Line(line)));
                }
                Err(_) => said.push((rank, Said::Garbled(line))),
            }
        }
        said
    }

    /// Every running client, to sample.
    pub fn running(&self) -> impl Iterator<Item = &Running> {
        self.ranks.iter().filter_map(|rank| rank.running.as_ref())
    }

    /// Whether any client exited on its own.
    pub fn any_exited(&mut self) -> bool {
        self.ranks
            .iter_mut()
            .any(|rank| rank.running.as_mut().is_some_and(|r| r.exited().is_some()))
    }

    /// Whether every client exited on its own.
    pub fn all_exited(&mut self) -> bool {
        self.ranks
            .iter_mut()
            .all(|rank| rank.running.as_mut().is_none_or(|r| r.exited().is_some()))
    }

    /// Closes every client's stdin: each stops after its current epoch.
    pub fn ask_to_stop(&mut self) {
        for rank in &mut self.ranks {
            rank.stdin.take();
        }
    }

    /// Waits for the readers of exited clients, so that their last lines are queued.
    pub fn join_readers(&mut self) {
        for rank in &mut self.ranks {
            if let Some(reader) = rank.reader.take() {
                let _ = reader.join();
            }
        }
    }
}
