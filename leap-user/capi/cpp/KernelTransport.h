// KernelTransport.h: the original engine's kernel-module transport, as its
// sources are built against it, over leap's kmod backend (the leap_kmod
// module's /dev/leap_tensor; the original module's ioctl wire toward
// original nodes). See Transport.h and LeapLink.h (the environment).

#ifndef LEAP_KERNEL_TRANSPORT_H
#define LEAP_KERNEL_TRANSPORT_H

#include <memory>
#include <string>

#include "Transport.h"

namespace Inference {
    namespace leap_detail {
        class Link;
    }

    class KernelTransport : public Transport {
    public:
        // Stores the addresses; initialize() opens.
        KernelTransport(int port, std::string next_ip, int next_port);

        ~KernelTransport() override;

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
        int port;
        std::string next_ip;
        int next_port;
        std::unique_ptr<leap_detail::Link> link_;
    };
} // namespace Inference

#endif // LEAP_KERNEL_TRANSPORT_H
