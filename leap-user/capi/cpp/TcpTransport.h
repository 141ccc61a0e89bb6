// TcpTransport.h: the original engine's TCP transport, as its sources are
// built against it, over leap's TCP with raw framing (the original's wire:
// frames back to back, control frames inline). initialize() listens on
// ip:port and connects to next_ip:next_port at the same time, within 60 s;
// a previous node that reconnects is taken back, a next node that restarts
// is connected again. See Transport.h and LeapLink.h (the environment).

#ifndef LEAP_TCP_TRANSPORT_H
#define LEAP_TCP_TRANSPORT_H

#include <memory>
#include <string>

#include "Transport.h"

namespace Inference {
    namespace leap_detail {
        class Link;
    }

    class TcpTransport : public Transport {
    public:
        // Stores the addresses; initialize() opens.
        TcpTransport(std::string ip, int port, std::string next_ip, int next_port);

        ~TcpTransport() override;

        void initialize() override;

        void send(const void *data, size_t size) override; // send_next
        void recv(void *data, size_t size) override;       // recv_prev

        void send_next(const void *data, size_t size) override;
        void recv_next(void *data, size_t size) override;
        void send_prev(const void *data, size_t size) override;
        void recv_prev(void *data, size_t size) override;

        void send_multipart_next(const void *header, size_t header_size, const void *data,
                                 size_t data_size) override;

        void send_control(const ControlMessage &msg) override;
        bool recv_control_nonblocking(ControlMessage &msg) override;

    protected:
        void packet_size_changed(size_t size) override;

    private:
        std::string ip;
        int port;
        std::string next_ip;
        int next_port;
        std::unique_ptr<leap_detail::Link> link_;
    };
} // namespace Inference

#endif // LEAP_TCP_TRANSPORT_H
