// UdpTransport.h: the original engine's UDP transport, as its sources are
// built against it, over leap's reliable UDP (the original's chunk format
// toward original nodes; loss recovery, CRC and chunk trains between leap
// nodes), or over leap's XDP paths when LEAP_UDP_PATH says xdp or
// xdp-ringbuf (the same wire). See Transport.h and LeapLink.h (the
// environment).

#ifndef LEAP_UDP_TRANSPORT_H
#define LEAP_UDP_TRANSPORT_H

#include <memory>
#include <string>

#include "Transport.h"

namespace Inference {
    namespace leap_detail {
        class Link;
    }

    class UdpTransport : public Transport {
    public:
        // Stores the addresses; initialize() opens.
        UdpTransport(std::string ip, int port, std::string next_ip, int next_port);

        ~UdpTransport() override;

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

#endif // LEAP_UDP_TRANSPORT_H
