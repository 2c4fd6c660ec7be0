// stepwatch C++ client: reports the timing of every training step to the stepwatch agent.
//
// Header-only, C++17, POSIX. No dependency beyond the standard library.
//
//   stepwatch::Reporter reporter;  // identity from RANK/WORLD_SIZE/... and $STEPWATCH_SOCKET
//   for (...) {
//     stepwatch::StepScope step(reporter, /*samples=*/batch_size);
//     { stepwatch::PhaseScope p(step, stepwatch::Phase::kData); batch = NextBatch(); }
//     { stepwatch::PhaseScope p(step, stepwatch::Phase::kCompute); Train(batch); }
//     { stepwatch::PhaseScope p(step, "optimizer"); optimizer.Step(); }  // a named section
//   }  // the step's event is sent when `step` goes out of scope
//
// Each step is one JSON message (the step-event datagram v1, docs/step-event.md) to the agent: a
// packet on a connection to its SOCK_SEQPACKET socket (`<socket>.seq`) when the agent has one, else
// a datagram on its Unix datagram socket (older agents). A connection queues as many messages as
// its send buffer holds; a datagram socket queues at most net.unix.max_dgram_qlen (10 by default),
// so bursts of ranks finishing a step together lose datagrams. Every message that leaves carries
// "dropped": the events this reporter failed to send since the previous message that left (left out
// when 0), which the agent counts per job. Nothing here throws or blocks the caller: by default
// events go through a bounded in-memory queue to a sender thread owned by the Reporter, so the
// caller never makes a system call. When the agent is absent, its queue is full, or the queue here
// is full, the event is dropped and counted (Reporter::dropped()), and a single warning goes to
// stderr.
//
// This is the one header to include; it brings in the parts, each with one job:
//   stepwatch/client_record.h          StepRecord, the limits, ValidateJob/StepRecord/SectionName
//   stepwatch/client_reporter.h        ReporterOptions and the Reporter
//   stepwatch/client_scopes.h          StepScope and PhaseScope
//   stepwatch/detail/reporter_setup.h  the Reporter's identity, setup and teardown
//   stepwatch/detail/reporter_send.h   formatting, queueing and sending events
//   stepwatch/detail/client_json.h     the JSON writer
//   stepwatch/detail/step_event_rules.h, stepwatch/detail/utf8.h: the step-event rules and the
//     UTF-8 decoder, shared with the agent and collector (one definition of each).
#pragma once

#include "stepwatch/client_record.h"
#include "stepwatch/client_reporter.h"
#include "stepwatch/client_scopes.h"
#include "stepwatch/detail/reporter_send.h"
#include "stepwatch/detail/reporter_setup.h"
