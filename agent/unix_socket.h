// Binding the agent's Unix sockets (the datagram and seqpacket sockets training processes send
// step events to): parent directories made, a stale socket of a dead agent replaced but a live one
// or a non-socket never touched, mode and group set, and senders' credentials asked for.
#pragma once

#include <sys/types.h>

#include <string>

#include "absl/status/statusor.h"

namespace stepwatch::agent {

struct UnixSocketSpec {
  // Mode of directories created on the way to the socket, and of the socket itself.
  mode_t directory_mode = 0755;
  mode_t socket_mode = 0660;
  // Group given the socket; (gid_t)-1 leaves it.
  gid_t group = static_cast<gid_t>(-1);
  // listen() backlog of a SOCK_SEQPACKET socket (at most SOMAXCONN).
  int backlog = 64;
};

// Binds `path` as a non-blocking socket of `type` (SOCK_DGRAM or SOCK_SEQPACKET, listening) with
// SO_PASSCRED, so that every message carries its sender's credentials. On error nothing is left
// behind: InvalidArgument for a path too long, AlreadyExists when another process serves it,
// FailedPrecondition when it is not a socket, Internal for a failed system call.
absl::StatusOr<int> BindUnixSocket(const UnixSocketSpec& spec, const std::string& path, int type);

}  // namespace stepwatch::agent
