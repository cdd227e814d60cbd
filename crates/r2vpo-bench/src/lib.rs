//! r2vpo's benchmarks, one module per `r2vpo bench` subcommand that is not
//! a domain's own measurement (`bench control` composes
//! `r2vpo_control::bench`'s). Each
//! takes its subcommand's arguments, measures, prints a table (ratios
//! against the peer measured in the same run where there is one) and
//! writes its JSON result; the CLI only dispatches to them. Speed claims
//! come from these tables, never from timed assertions in tests.

pub mod backend_args;
pub mod control;
pub mod objectives;
pub mod packing;
pub mod queue;
pub mod serve;
pub mod step;
