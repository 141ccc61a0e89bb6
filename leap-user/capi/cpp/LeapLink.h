// LeapLink.h: what TcpTransport, UdpTransport and KernelTransport share:
// one libleap transport opened from the constructor's addresses and the
// environment, and the engine's calls mapped onto the C API. Included by
// their .cpp files only (it includes leap.h); an engine never sees it.
//
// The environment, read by initialize():
//   LEAP_UDP_PATH   udp (default) | xdp | xdp-ringbuf: what UdpTransport
//                   opens (the three share the wire format)
//   LEAP_INTERFACE  the interface frames arrive on (xdp, xdp-ringbuf)
//   LEAP_CONFIG     a file of `key = value` lines ('#' comments), the keys
//                   of leap_config_set (a node file's [transport] keys)
//   LEAP_OPTIONS    `key=value,key=value` with the same keys (a list value
//                   in brackets: queues=[0,1])
//   LEAP_STATS      1: each transport prints its counters as one JSON line
//                   on stderr when it is destroyed
// Later wins: the defaults below, the constructor's addresses, LEAP_CONFIG,
// LEAP_OPTIONS, LEAP_INTERFACE.
//
// Defaults that differ from a node file's: recv_timeout_ms = 0 (no receive
// deadline: an idle worker waits for the next request as the original
// does, and the original engine ends a worker on any exception);
// frame_size = 131072 on the datagram paths (the largest frame taken: any
// model with dim up to 32766; the module's bank; XDP's buffers stay at
// their defaults); setup_timeout_s = 60 on TCP (the original retries its
// connect for a minute).

#ifndef LEAP_LEAP_LINK_H
#define LEAP_LEAP_LINK_H

#include <leap.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "Transport.h"

// The engine's control types are the library's, byte for byte.
static_assert(sizeof(Inference::ControlPacketHeader) == LEAP_CONTROL_FRAME_MIN, "control frame size");
static_assert(Inference::CONTROL_MAGIC == LEAP_CONTROL_MARKER, "control marker");
static_assert(Inference::MAX_WORKERS == LEAP_MAX_WORKERS, "workers per RESIZE_CHAIN");
static_assert(static_cast<int>(Inference::ControlMessageType::RESIZE_LAYERS) == LEAP_CONTROL_RESIZE_LAYERS);
static_assert(static_cast<int>(Inference::ControlMessageType::RESIZE_CHAIN) == LEAP_CONTROL_RESIZE_CHAIN);
static_assert(static_cast<int>(Inference::ControlMessageType::ACK) == LEAP_CONTROL_ACK);

namespace Inference::leap_detail {
    // The largest frame the datagram paths take unless told otherwise.
    inline constexpr size_t DATAGRAM_FRAME_SIZE = 131072;

    // One setting and where it came from (for errors).
    struct Setting {
        std::string key;
        std::string value;
        std::string origin;
    };

    inline std::string trim(const std::string &s) {
        const char *ws = " \t\r\n";
        const size_t a = s.find_first_not_of(ws);
        if (a == std::string::npos) return "";
        return s.substr(a, s.find_last_not_of(ws) - a + 1);
    }

    // The one parser of settings: `key = value` entries separated by `sep`
    // ('\n' for LEAP_CONFIG, ',' for LEAP_OPTIONS, where a comma inside
    // brackets does not separate). '#' outside quotes starts a comment;
    // blank entries are skipped; a value in matching quotes loses them.
    inline std::vector<Setting> parse_settings(const std::string &text, char sep, const std::string &origin) {
        std::vector<std::string> entries(1);
        int depth = 0;
        char quote = 0;
        bool comment = false;
        for (const char c: text) {
            if (c == sep && depth == 0 && quote == 0) {
                entries.emplace_back();
                comment = false;
                continue;
            }
            if (comment) continue;
            if (quote != 0) {
                if (c == quote) quote = 0;
            } else if (c == '"' || c == '\'') {
                quote = c;
            } else if (c == '#') {
                comment = true;
                continue;
            } else if (c == '[') {
                depth++;
            } else if (c == ']' && depth > 0) {
                depth--;
            }
            entries.back() += c;
        }
        std::vector<Setting> out;
        const char *unit = sep == '\n' ? " line " : " entry ";
        for (size_t i = 0; i < entries.size(); i++) {
            const std::string e = trim(entries[i]);
            if (e.empty()) continue;
            const std::string where = origin + unit + std::to_string(i + 1);
            const size_t eq = e.find('=');
            if (e.front() == '[' && eq == std::string::npos) {
                throw std::runtime_error(where + ": `" + e + "`: sections are not read; give key = value " +
                                         "(the keys of a node file's [transport] table)");
            }
            if (eq == std::string::npos || trim(e.substr(0, eq)).empty()) {
                throw std::runtime_error(where + ": `" + e + "` is not key = value");
            }
            std::string value = trim(e.substr(eq + 1));
            if (value.size() >= 2 && (value.front() == '"' || value.front() == '\'') &&
                value.back() == value.front()) {
                value = value.substr(1, value.size() - 2);
            }
            out.push_back({trim(e.substr(0, eq)), value, where});
        }
        return out;
    }

    // ADDR:PORT as leap reads it ([v6]:port for IPv6).
    inline std::string endpoint(const std::string &ip, int port) {
        if (ip.find(':') != std::string::npos && ip.front() != '[') {
            return "[" + ip + "]:" + std::to_string(port);
        }
        return ip + ":" + std::to_string(port);
    }

    inline const char *env(const char *name) {
        const char *v = std::getenv(name);
        return v != nullptr && *v != '\0' ? v : nullptr;
    }

    // A libleap transport as one of the engine's classes uses it.
    class Link {
    public:
        // `who` names the class in errors; `kind` is "tcp", "udp" (the
        // path is chosen by LEAP_UDP_PATH at initialize) or "kmod".
        Link(std::string who, std::string kind, std::string listen, std::string next)
            : who_(std::move(who)), kind_(std::move(kind)), listen_(std::move(listen)), next_(std::move(next)) {
        }

        ~Link() {
            if (t_ != nullptr && env("LEAP_STATS") != nullptr) print_stats();
            leap_free(t_);
        }

        Link(const Link &) = delete;
        Link &operator=(const Link &) = delete;

        // Opens the transport (initialize()); `packet_size` is the frame
        // length when set_packet_size() came first, else 0.
        void open(size_t packet_size) {
            if (t_ != nullptr) throw std::runtime_error(who_ + "::initialize: already initialized");
            std::string kind = kind_;
            if (kind == "udp") {
                if (const char *p = env("LEAP_UDP_PATH")) kind = p;
                if (kind != "udp" && kind != "xdp" && kind != "xdp-ringbuf") {
                    throw std::runtime_error(who_ + "::initialize: LEAP_UDP_PATH=" + kind +
                                             ": choose udp, xdp or xdp-ringbuf");
                }
            }
            leap_config *c = nullptr;
            check(leap_config_new(kind.c_str(), &c), "initialize");
            try {
                configure(c, kind, packet_size);
                leap_transport *t = nullptr;
                check(leap_open(c, &t), "initialize");
                t_ = t;
            } catch (...) {
                leap_config_free(c);
                throw;
            }
            leap_config_free(c);
            tcp_ = kind == "tcp";
            if (packet_size > 0) set_frame_len(packet_size, "initialize");
        }

        // set_packet_size(): the length of the frames to come (TCP reads
        // exactly that; the datagram paths check it against frame_size).
        void set_frame_len(size_t len, const char *method = "set_packet_size") {
            if (t_ == nullptr || len == 0 || len == frame_len_) return;
            check(leap_set_frame_len(t_, len), method);
            frame_len_ = len;
        }

        void send(const void *data, size_t size) {
            check(leap_send_next(open_t("send_next"), data, size), "send_next");
        }

        void send_multipart(const void *header, size_t header_size, const void *data, size_t data_size) {
            check(leap_send_multipart_next(open_t("send_multipart_next"), header, header_size, data, data_size),
                  "send_multipart_next");
        }

        // As the original pads: to the packet size when that holds the
        // message, else the 164 bytes alone. Sent as a control frame.
        void send_control(const ControlMessage &msg, size_t packet_size) {
            leap_control c{};
            c.kind = static_cast<uint8_t>(msg.type);
            c.is_tail = msg.is_tail;
            c.split_layer = msg.split_layer;
            c.end_layer = msg.end_layer;
            c.worker_index = msg.worker_index;
            c.total_workers = msg.total_workers;
            for (int i = 0; i < MAX_WORKERS; i++) {
                c.ranges[i].start_layer = msg.ranges[i].start_layer;
                c.ranges[i].end_layer = msg.ranges[i].end_layer;
                c.ranges[i].is_tail = msg.ranges[i].is_tail;
            }
            const size_t len = packet_size >= LEAP_CONTROL_FRAME_MIN ? packet_size : LEAP_CONTROL_FRAME_MIN;
            check(leap_send_control(open_t("send_control"), &c, len), "send_control");
        }

        // The whole next frame into data (a frame shorter than size is
        // followed by zeros). No deadline unless recv_timeout_ms is set;
        // TCP takes a previous node that reconnects.
        void recv(void *data, size_t size) {
            leap_transport *t = open_t("recv_prev");
            if (size == 0) return;
            set_frame_len(size, "recv_prev");
            size_t len = 0;
            leap_status s = leap_recv_prev(t, data, size, &len, nullptr);
            if (s == LEAP_ERR_PEER_CLOSED) s = leap_recv_prev(t, data, size, &len, nullptr);
            check(s, "recv_prev");
            if (len < size) std::memset(static_cast<char *>(data) + len, 0, size - len);
        }

        // A control frame that has arrived, taken; a data frame stays held
        // for the next recv (leap_peek_prev): nothing consumed or reordered.
        bool recv_control(ControlMessage &msg) {
            // TCP cannot cut a frame out of the stream before it knows the
            // length (set_packet_size or a first recv_prev).
            if (t_ == nullptr || (tcp_ && frame_len_ == 0)) return false;
            const void *data = nullptr;
            size_t len = 0;
            leap_frame_kind kind = LEAP_FRAME_DATA;
            const leap_status s = leap_peek_prev(t_, &data, &len, &kind);
            if (s == LEAP_ERR_AGAIN || s == LEAP_ERR_PEER_CLOSED) return false;
            check(s, "recv_control_nonblocking");
            if (kind != LEAP_FRAME_CONTROL || len < sizeof(ControlPacketHeader)) return false;
            std::memcpy(&msg, static_cast<const char *>(data) + sizeof(uint16_t), sizeof(ControlMessage));
            check(leap_release(t_), "recv_control_nonblocking");
            return true;
        }

        [[noreturn]] void unsupported(const char *method) const {
            throw std::runtime_error(who_ + "::" + method + " not supported in Ring topology");
        }

    private:
        void check(leap_status s, const char *method) const {
            if (s != LEAP_OK) throw std::runtime_error(who_ + "::" + method + ": " + leap_last_error());
        }

        leap_transport *open_t(const char *method) const {
            if (t_ == nullptr) {
                throw std::runtime_error(who_ + "::" + method + ": not initialized: call initialize() first");
            }
            return t_;
        }

        void set(leap_config *c, const Setting &s) const {
            if (leap_config_set(c, s.key.c_str(), s.value.c_str()) != LEAP_OK) {
                throw std::runtime_error(who_ + "::initialize: " + s.origin + ": " + leap_last_error());
            }
        }

        void configure(leap_config *c, const std::string &kind, size_t packet_size) const {
            const std::string ours = "the defaults";
            set(c, {"recv_timeout_ms", "0", ours});
            if (kind == "tcp") {
                set(c, {"setup_timeout_s", "60", ours});
                if (packet_size > 0) set(c, {"frame_size", std::to_string(packet_size), ours});
            } else {
                set(c, {"frame_size", std::to_string(DATAGRAM_FRAME_SIZE), ours});
            }
            set(c, {"listen", listen_, "the constructor's address"});
            set(c, {"next", next_, "the constructor's next address"});
            if (const char *path = env("LEAP_CONFIG")) {
                std::ifstream f(path);
                if (!f) {
                    throw std::runtime_error(who_ + "::initialize: LEAP_CONFIG=" + path +
                                             ": cannot read it (" + std::strerror(errno) + ")");
                }
                std::stringstream text;
                text << f.rdbuf();
                for (const Setting &s: parse_settings(text.str(), '\n', std::string("LEAP_CONFIG ") + path)) {
                    set(c, s);
                }
            }
            if (const char *opts = env("LEAP_OPTIONS")) {
                for (const Setting &s: parse_settings(opts, ',', "LEAP_OPTIONS")) set(c, s);
            }
            if (const char *iface = env("LEAP_INTERFACE")) set(c, {"interface", iface, "LEAP_INTERFACE"});
        }

        void print_stats() const {
            leap_stats st{};
            if (leap_get_stats(t_, &st) != LEAP_OK) return;
            std::fprintf(stderr,
                         "{\"leap_stats\":\"%s\",\"frames_sent\":%llu,\"frames_received\":%llu,"
                         "\"frames_lost\":%llu,\"retransmits\":%llu,\"chunks_recovered\":%llu,"
                         "\"nacks_sent\":%llu,\"timeouts\":%llu,\"bad_crc\":%llu,\"copied_bytes\":%llu,"
                         "\"bytes_received\":%llu}\n",
                         leap_kind(t_), static_cast<unsigned long long>(st.frames_sent),
                         static_cast<unsigned long long>(st.frames_received),
                         static_cast<unsigned long long>(st.frames_lost),
                         static_cast<unsigned long long>(st.retransmits),
                         static_cast<unsigned long long>(st.chunks_recovered),
                         static_cast<unsigned long long>(st.nacks_sent),
                         static_cast<unsigned long long>(st.timeouts),
                         static_cast<unsigned long long>(st.drops.bad_crc),
                         static_cast<unsigned long long>(st.copied_bytes),
                         static_cast<unsigned long long>(st.bytes_received));
        }

        std::string who_;
        std::string kind_;
        std::string listen_;
        std::string next_;
        leap_transport *t_ = nullptr;
        bool tcp_ = false;
        // The frame length leap was given (0: none yet).
        size_t frame_len_ = 0;
    };
} // namespace Inference::leap_detail

#endif // LEAP_LEAP_LINK_H
