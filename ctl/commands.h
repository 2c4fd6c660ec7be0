// stepwatchctl's commands (status, findings, explain, report, serve), each asking the collectors
// of a Session and printing the merged answer; each returns the process's exit code.
#pragma once

#include <signal.h>

#include <string>
#include <vector>

#include "ctl/serve.h"
#include "ctl/session.h"

namespace stepwatch::ctl {

// `rest`: the arguments after the command (at most one JOB, checked by the caller).
int RunStatus(const Session& session, const std::vector<std::string>& rest);
int RunFindings(const Session& session, const std::vector<std::string>& rest);
int RunExplain(const Session& session, const std::string& job);
int RunReport(const Session& session, const std::vector<std::string>& rest);
// Serves the live view until one of `stop_signals` (blocked by the caller in every thread).
int RunServe(const Session& session, const ServeOptions& options, const sigset_t& stop_signals);

}  // namespace stepwatch::ctl
