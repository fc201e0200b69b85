#include "runtime/optimizer_shards.h"

#include <algorithm>
#include <numeric>
#include <unordered_set>

#include "runtime/error.h"

namespace napkin::runtime {

namespace {

int find(std::vector<int>& parent, int i) {
  while (parent[static_cast<size_t>(i)] != i) i = parent[static_cast<size_t>(i)] = parent[static_cast<size_t>(parent[static_cast<size_t>(i)])];
  return i;
}

}  // namespace

OptimizerShards::OptimizerShards(const Program& program, int ranks, int rank) : program_(program), rank_(rank) {
  const std::vector<const TensorSpec*> params = program.with_role(TensorRole::Param);
  std::unordered_map<std::string, int> index;
  for (size_t i = 0; i < params.size(); ++i) index[params[i]->name] = static_cast<int>(i);
  std::vector<int64_t> bytes(params.size());
  for (size_t i = 0; i < params.size(); ++i) bytes[i] = params[i]->bytes;
  for (const TensorSpec* s : program.with_role(TensorRole::State)) {
    state_bytes_ += s->bytes;
    if (auto it = index.find(s->param); it != index.end()) bytes[static_cast<size_t>(it->second)] += s->bytes;
  }

  // What "every parameter" means to a kernel: every one some optimizer kernel serves (a parameter the loss
  // does not reach has no gradient, no update, and no part in the clipping norm).
  std::unordered_set<std::string> trained;
  for (const KernelSpec& k : program.kernels) {
    trained.insert(k.serves.begin(), k.serves.end());
    if (const LoopSpec* batch = k.as<LoopSpec>())
      for (const LoopSpec::Member& m : batch->members) trained.insert(m.serves.begin(), m.serves.end());
  }
  const size_t everything = trained.size();

  // Units: parameters that share a kernel whose members cannot run apart.
  std::vector<int> parent(params.size());
  std::iota(parent.begin(), parent.end(), 0);
  // Whether a kernel writes a parameter or its optimizer state (an update), rather than what the parameters
  // share (the gradient norm, the clip factor).
  std::vector<std::pair<int64_t, int64_t>> updated;  // arena byte ranges
  for (const TensorSpec* t : params) updated.push_back({t->offset, t->offset + t->bytes});
  for (const TensorSpec* s : program.with_role(TensorRole::State))
    if (!s->param.empty()) updated.push_back({s->offset, s->offset + s->bytes});
  auto updates = [&](const KernelSpec& k) {
    return std::any_of(updated.begin(), updated.end(),
                       [&](const auto& r) { return r.first <= k.out_offset && k.out_offset < r.second; });
  };
  auto bind_together = [&](const std::vector<std::string>& serves, bool update) {
    // What every parameter needs (the gradient norm for clipping) runs on every rank that owns any: it binds
    // none of them together. An update that serves every parameter (a batch of all of them that cannot run
    // apart: its members not listed) binds them all.
    if (serves.empty() || (serves.size() >= everything && !update)) return;
    const int first = index.at(serves.front());
    for (const std::string& p : serves) parent[static_cast<size_t>(find(parent, index.at(p)))] = find(parent, first);
  };
  for (const KernelSpec& k : program.kernels) {
    if (k.shared) continue;
    const LoopSpec* batch = k.as<LoopSpec>();
    if (!batch || batch->members.empty()) bind_together(k.serves, updates(k));
    else
      for (const LoopSpec::Member& m : batch->members)
        if (!m.shared) bind_together(m.serves, false);
  }
  std::vector<int> roots;
  std::vector<int64_t> unit_bytes(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    const int r = find(parent, static_cast<int>(i));
    if (r == static_cast<int>(i)) roots.push_back(r);
    unit_bytes[static_cast<size_t>(r)] += bytes[i];
  }
  std::stable_sort(roots.begin(), roots.end(), [&](int a, int b) {
    return unit_bytes[static_cast<size_t>(a)] > unit_bytes[static_cast<size_t>(b)];
  });
  std::vector<int64_t> load(static_cast<size_t>(ranks), 0);
  std::vector<int> owner_of_root(params.size(), 0);
  for (int r : roots) {
    const int least = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    owner_of_root[static_cast<size_t>(r)] = least;
    load[static_cast<size_t>(least)] += unit_bytes[static_cast<size_t>(r)];
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const int o = owner_of_root[static_cast<size_t>(find(parent, static_cast<int>(i)))];
    owner_[params[i]->name] = o;
    param_bytes_ += params[i]->bytes;
    if (o == rank_) ++owned_params_, owned_param_bytes_ += params[i]->bytes;
    else others_params_.push_back(params[i]);
  }
  for (const TensorSpec* s : program.with_role(TensorRole::State))
    if (!s->param.empty() && owner_.at(s->param) == rank_) owned_state_bytes_ += s->bytes;

  // What every parameter needs runs on every rank, even one that owns none: under ZeRO-2 each rank's part of the
  // gradient norm goes into an all_reduce_sum that every rank must reach. An update runs where its parameters are.
  auto mine = [&](const std::vector<std::string>& serves, bool update) {
    return (serves.size() >= everything && !update) ||
           std::any_of(serves.begin(), serves.end(), [&](const std::string& p) { return owner_.at(p) == rank_; });
  };
  skip_kernel_.assign(program.kernels.size(), false);
  run_member_.assign(program.kernels.size(), {});
  for (size_t i = 0; i < program.kernels.size(); ++i) {
    const KernelSpec& k = program.kernels[i];
    if (k.shared) continue;
    skip_kernel_[i] = !mine(k.serves, updates(k));
    const LoopSpec* batch = k.as<LoopSpec>();
    if (skip_kernel_[i] || !batch || batch->members.empty()) continue;
    std::vector<bool> run;
    for (const LoopSpec::Member& m : batch->members) run.push_back(m.shared || mine(m.serves, false));
    if (std::count(run.begin(), run.end(), true) < static_cast<std::ptrdiff_t>(run.size())) run_member_[i] = run;
  }
  for (const TensorSpec* s : program.with_role(TensorRole::State))
    if (!s->param.empty() && owner_.at(s->param) != rank_) others_state_.push_back(s);
  skip_update_.assign(program.updates.size(), false);
  for (size_t u = 0; u < program.updates.size(); ++u)
    skip_update_[u] = !program.updates[u].param.empty() && owner_.at(program.updates[u].param) != rank_;
}

int OptimizerShards::tensor_owner(const TensorSpec& t) const {
  if (t.role == TensorRole::Param) return owner_.at(t.name);
  return t.param.empty() ? 0 : owner_.at(t.param);
}

void OptimizerShards::gather_params(Engine& engine, Communicator& comm) const {
  engine.download(TensorRole::Param);
  for (const TensorSpec* t : program_.with_role(TensorRole::Param)) comm.broadcast(engine.host(*t), t->bytes, owner_.at(t->name));
  engine.upload(TensorRole::Param);
}

void OptimizerShards::gather_to_root(Engine& engine, Communicator& comm, TensorRole role) const {
  engine.download(role);
  for (const TensorSpec* t : program_.with_role(role)) {
    const int owner = tensor_owner(*t);  // shared state: rank 0's already
    if (owner == 0) continue;
    if (rank_ == owner) comm.send(engine.host(*t), t->bytes, 0);
    if (rank_ == 0) comm.receive(engine.host(*t), t->bytes, owner);
  }
  if (rank_ == 0) engine.upload(role);
}

}  // namespace napkin::runtime
