#include "submit_validator.h"

#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "log.h"
#include "submit_checks.h"

namespace ckpt::scheduler {

// Shared by the validator and the handlers it posts, which may run after the
// validator is gone (they then find `closed`). Event loop thread only.
struct SubmitValidator::State {
  explicit State(boost::asio::io_context& i, int max) : io(i), max_running(max) {}
  boost::asio::io_context& io;
  const int max_running;
  int running = 0;  // threads not yet ended, overrun ones included
  uint64_t next_id = 1;
  bool closed = false;
  std::map<uint64_t, std::thread> threads;
};

namespace {

// One submission: answered once, by its result or by its deadline.
struct Job {
  explicit Job(boost::asio::io_context& io) : deadline(io) {}
  boost::asio::steady_timer deadline;
  SubmitValidator::Done done;
  bool answered = false;
};

std::string Seconds(std::chrono::milliseconds ms) {
  const double s = static_cast<double>(ms.count()) / 1000;
  std::string text = std::to_string(s);
  while (text.size() > 1 && text.back() == '0') text.pop_back();
  if (!text.empty() && text.back() == '.') text.pop_back();
  return text;
}

}  // namespace

SubmitValidator::SubmitValidator(boost::asio::io_context& io, int max_running)
    : state_(std::make_shared<State>(io, max_running)) {}

SubmitValidator::~SubmitValidator() {
  state_->closed = true;
  // A validation ends on its own; its result, posted to a loop that no
  // longer runs, is dropped with the loop.
  for (auto& [id, t] : state_->threads) {
    if (t.joinable()) t.join();
  }
  state_->threads.clear();
}

Status SubmitValidator::Start(const ControlOptions& options, std::string toml, std::string origin,
                              Done done) {
  std::shared_ptr<State> state = state_;
  if (state->running >= state->max_running) {
    return Status::Unavailable(std::to_string(state->running) +
                               " submissions are being validated, the most at once; submit again "
                               "when one has been answered");
  }
  auto job = std::make_shared<Job>(state->io);
  job->done = std::move(done);
  const std::chrono::milliseconds bound = options.submit_validation_timeout;
  job->deadline.expires_after(bound);
  job->deadline.async_wait([state, job, bound, origin](const boost::system::error_code& ec) {
    if (ec || job->answered || state->closed) return;
    job->answered = true;
    Logger().warn("control: validating {} took longer than submit_validation_timeout_s ({} s)",
                  origin, Seconds(bound));
    job->done(Status::ResourceExhausted(
        origin +
        ": validating the experiment and its files took longer than "
        "submit_validation_timeout_s (" +
        Seconds(bound) +
        " s); nothing was created (raise the bound in the service's configuration, or submit a "
        "smaller file)"));
  });
  const uint64_t id = state->next_id++;
  ++state->running;
  state->threads[id] = std::thread(
      [state, job, id, options, toml = std::move(toml), origin = std::move(origin)]() mutable {
        StatusOr<records::ExperimentConfig> result = Status::Internal("validation did not run");
        try {
          if (options.before_validation) options.before_validation();
          result = PrepareSubmission(options, toml, origin);
        } catch (const std::exception& e) {
          Logger().error("control: validating {} threw: {}", origin, e.what());
          result = Status::Internal(origin + ": validation failed: " + e.what());
        } catch (...) {
          Logger().error("control: validating {} threw a non-standard exception", origin);
          result = Status::Internal(origin + ": validation failed");
        }
        boost::asio::post(state->io, [state, job, id, result = std::move(result)]() mutable {
          --state->running;
          auto it = state->threads.find(id);
          if (it != state->threads.end()) {
            it->second.join();  // it has posted this and is returning
            state->threads.erase(it);
          }
          if (state->closed || job->answered) return;
          job->answered = true;
          try {
            job->deadline.cancel();
          } catch (const boost::system::system_error&) {
            // The deadline fires later and finds the job answered.
          }
          job->done(std::move(result));
        });
      });
  return Status::OK();
}

}  // namespace ckpt::scheduler
