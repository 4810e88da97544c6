// `ckpt-tool top` (service_commands.h): the service view of service_view.h,
// refreshed every second, full-screen with ncurses on a terminal (the one
// file of ckpt-tool that uses it), a frame of plain text per refresh
// otherwise.
#include <unistd.h>

#include <chrono>
#include <thread>

#include "service_commands.h"
#include "service_view.h"
#include "session.h"

// Last: curses defines OK and ERR as macros, which would clash with Status::OK.
#include <curses.h>
#undef OK

namespace ckpt::tool {
namespace {

using Clock = std::chrono::steady_clock;

// Everything top shows of one `status` reply.
std::vector<std::string> Frame(const scheduler::ServiceStatus& status) {
  std::vector<std::string> lines = ServiceView(status);
  lines.emplace_back("");
  for (auto& w : WorkersView(status)) lines.push_back(std::move(w));
  return lines;
}

StatusOr<std::vector<std::string>> Refresh(scheduler::ControlClient* client) {
  CKPT_ASSIGN_OR_RETURN(scheduler::ServiceStatus status, client->Overview());
  return Frame(status);
}

Status PlainTop(const ToolOptions& tool, scheduler::ControlClient* client,
                const TopOptions& options) {
  for (int i = 0; options.iterations == 0 || i < options.iterations; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(options.refresh_ms));
    if (tool.json) {  // the protocol's own form, one status reply per line
      CKPT_ASSIGN_OR_RETURN(std::string line, client->CallChecked(R"({"verb":"status"})"));
      CKPT_RETURN_IF_ERROR(Print(tool.out, line + "\n"));
      continue;
    }
    CKPT_ASSIGN_OR_RETURN(auto lines, Refresh(client));
    std::string out;
    for (const auto& l : lines) out += l + "\n";
    CKPT_RETURN_IF_ERROR(Print(tool.out, out + "\n"));
  }
  return Status::OK();
}

// Ends curses mode on every way out.
class Screen {
 public:
  Screen() {
    initscr();
    cbreak();
    noecho();
    curs_set(0);
    keypad(stdscr, TRUE);
  }
  ~Screen() { endwin(); }
  Screen(const Screen&) = delete;
  Screen& operator=(const Screen&) = delete;

  void Draw(const std::vector<std::string>& lines, const std::string& footer) {
    erase();
    int rows = 0, cols = 0;
    getmaxyx(stdscr, rows, cols);
    int y = 0;
    for (const auto& l : lines) {
      if (y >= rows - 1) break;
      if (y == 0) attron(A_BOLD);
      mvaddnstr(y++, 0, l.c_str(), cols);
      if (y == 1) attroff(A_BOLD);
    }
    attron(A_REVERSE);
    mvaddnstr(rows - 1, 0, footer.c_str(), cols);
    attroff(A_REVERSE);
    refresh();
  }

  // The key pressed within `ms`, or ERR.
  int Key(int ms) {
    timeout(ms);
    return getch();
  }
};

Status TerminalTop(scheduler::ControlClient* client, const TopOptions& options) {
  Screen screen;
  for (int i = 0; options.iterations == 0 || i < options.iterations; ++i) {
    CKPT_ASSIGN_OR_RETURN(auto lines, Refresh(client));
    screen.Draw(lines, " q quit   refreshed every " +
                           std::to_string(options.refresh_ms / 1000.0).substr(0, 3) + " s ");
    const auto until = Clock::now() + std::chrono::milliseconds(options.refresh_ms);
    while (true) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
      if (left <= 0) break;
      const int key = screen.Key(static_cast<int>(left));
      if (key == 'q' || key == 'Q') return Status::OK();
    }
  }
  return Status::OK();
}

}  // namespace

Status Top(const ToolOptions& tool, const TopOptions& options) {
  CKPT_ASSIGN_OR_RETURN(auto client, ConnectService(tool));
  if (tool.json || isatty(fileno(tool.out)) != 1 || isatty(STDIN_FILENO) != 1) {
    return PlainTop(tool, client.get(), options);
  }
  return TerminalTop(client.get(), options);
}

}  // namespace ckpt::tool
