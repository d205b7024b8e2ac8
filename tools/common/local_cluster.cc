#include "tools/common/local_cluster.h"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>

namespace sparsereduce::tools {

namespace fs = std::filesystem;

Result<std::unique_ptr<LocalAggregators>> LocalAggregators::Start(const std::string& binary, uint32_t count,
                                                                  const std::vector<std::string>& extra_args) {
  auto cluster = std::unique_ptr<LocalAggregators>(new LocalAggregators());
  auto dir = TempDir::Create("sparsereduce-");
  if (!dir.ok()) return dir.status();
  cluster->dir_ = std::make_unique<TempDir>(std::move(*dir));
  for (uint32_t a = 0; a < count; ++a) {
    const std::string port_file = cluster->dir_->File("port" + std::to_string(a));
    std::vector<std::string> argv = {binary,        "--listen",    "127.0.0.1:0", "--metrics-listen",
                                     "127.0.0.1:0", "--port-file", port_file,     "--log-level",
                                     "warn"};
    argv.insert(argv.end(), extra_args.begin(), extra_args.end());
    auto daemon = Subprocess::Spawn(argv, false);
    if (!daemon.ok()) return daemon.status();
    auto port = WaitForFileLine(port_file, std::chrono::seconds(10), daemon->get());
    if (!port.ok()) return port.status().WithContext("aggregator " + std::to_string(a) + " did not start");
    cluster->addresses_.push_back("127.0.0.1:" + *port);
    cluster->daemons_.push_back(std::move(*daemon));
  }
  return cluster;
}

LocalAggregators::~LocalAggregators() {
  daemons_.clear();  // kills what is still running, before its directory goes
}

std::string LocalAggregators::AddressList() const {
  std::string out;
  for (const auto& a : addresses_) out += (out.empty() ? "" : ",") + a;
  return out;
}

bool LocalAggregators::Stop() {
  bool clean = true;
  for (auto& d : daemons_) d->Signal(SIGTERM);
  for (auto& d : daemons_) {
    auto status = d->Wait(std::chrono::seconds(10));
    clean = clean && status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
  }
  return clean;
}

std::string FindToolBinary(const std::string& name, const std::string& build_subdir) {
  const fs::path self = fs::canonical("/proc/self/exe").parent_path();
  for (const fs::path& candidate : {self / name, self.parent_path() / build_subdir / name}) {
    if (fs::exists(candidate)) return candidate.string();
  }
  return (self / name).string();
}

}  // namespace sparsereduce::tools
